//! Writes the benchmark's ImageNet-like JPEG folder and prints its path:
//! `cargo run --release -p benches --bin make-dataset -- [COUNT] [ROOT]`.

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let count = match args.next() {
        Some(c) => c
            .parse()
            .map_err(|e| std::io::Error::other(format!("COUNT {c:?}: {e}")))?,
        None => 2000,
    };
    let root = args.next().map_or_else(benches::data_root, Into::into);
    let dir = benches::imagenet_like(&root, count)?;
    println!("{}", dir.display());
    Ok(())
}
