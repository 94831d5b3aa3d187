//! With the `cuda` feature: compiles the fused normalize kernel
//! (`src/device/normalize.cu`) with nvcc into a fatbin holding SASS for the
//! compute capability in `CUDA_COMPUTE_CAP` (default 75), which the driver
//! runs as it is (no compile on first use), and PTX for the same virtual
//! architecture, which the driver compiles for any newer GPU.
use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo::rerun-if-changed=src/device/normalize.cu");
    println!("cargo::rerun-if-env-changed=CUDA_COMPUTE_CAP");
    println!("cargo::rerun-if-env-changed=NVCC");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"))
        .join("normalize.fatbin");
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "75".into());
    let cap = cap.trim().replace('.', "");
    let nvcc = std::env::var("NVCC").unwrap_or_else(|_| "nvcc".into());
    let status = Command::new(&nvcc)
        .args([
            "--fatbin",
            "-O3",
            "-gencode",
            &format!("arch=compute_{cap},code=sm_{cap}"),
            "-gencode",
            &format!("arch=compute_{cap},code=compute_{cap}"),
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
