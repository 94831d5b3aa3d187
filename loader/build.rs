//! With the `cuda` feature: compiles the fused normalize kernel
//! (`src/device/normalize.cu`) to PTX with nvcc, as candle-kernels does, for
//! the virtual architecture in `CUDA_COMPUTE_CAP` (default 75; the driver
//! JIT-compiles PTX for any newer GPU).
use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo::rerun-if-changed=src/device/normalize.cu");
    println!("cargo::rerun-if-env-changed=CUDA_COMPUTE_CAP");
    println!("cargo::rerun-if-env-changed=NVCC");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let out =
        PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("normalize.ptx");
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "75".into());
    let cap = cap.trim().replace('.', "");
    let nvcc = std::env::var("NVCC").unwrap_or_else(|_| "nvcc".into());
    let status = Command::new(&nvcc)
        .args([
            "--ptx",
            "-O3",
            &format!("--gpu-architecture=compute_{cap}"),
            "-o",
        ])
        .arg(&out)
        .arg("src/device/normalize.cu")
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("{nvcc} failed ({s}) compiling src/device/normalize.cu"),
        Err(e) => panic!(
            "the cuda feature needs nvcc on PATH (or NVCC=...) to compile src/device/normalize.cu: {e}"
        ),
    }
}
