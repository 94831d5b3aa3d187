//! Helpers for wick's integration tests: datasets generated on the fly.

use image::{ImageFormat, Rgb, RgbImage};
use std::io::Cursor;
use std::path::{Path, PathBuf};

/// An RGB image whose pixels depend on `(x, y, seed)` in a way that JPEG
/// keeps distinct: smooth gradients plus a seed-dependent colour cast.
pub fn pattern(width: u32, height: u32, seed: u32) -> RgbImage {
    RgbImage::from_fn(width, height, |x, y| {
        Rgb([
            ((x * 255 / width.max(1)) as u8).wrapping_add((seed * 37) as u8),
            ((y * 255 / height.max(1)) as u8).wrapping_add((seed * 91) as u8),
            (((x + y) * 3) as u8).wrapping_add((seed * 13) as u8),
        ])
    })
}

/// `img` encoded as `format`.
pub fn encode(img: &RgbImage, format: ImageFormat) -> Vec<u8> {
    let mut out = Cursor::new(Vec::new());
    img.write_to(&mut out, format).expect("encode test image");
    out.into_inner()
}

/// Writes an ImageFolder under `root`: `classes` folders `class{c}` with
/// `per_class` images each, JPEG and PNG alternating, sizes varying from
/// 30x26 upwards. Returns the paths written, in ImageFolder order.
pub fn image_folder(root: &Path, classes: usize, per_class: usize) -> Vec<PathBuf> {
    let mut paths = Vec::new();
    for c in 0..classes {
        let dir = root.join(format!("class{c}"));
        std::fs::create_dir_all(&dir).expect("create class folder");
        for i in 0..per_class {
            let seed = (c * per_class + i) as u32;
            let img = pattern(30 + (seed % 7) * 5, 26 + (seed % 5) * 6, seed);
            let (ext, fmt) = if i % 2 == 0 {
                ("jpg", ImageFormat::Jpeg)
            } else {
                ("png", ImageFormat::Png)
            };
            let path = dir.join(format!("{i:04}.{ext}"));
            std::fs::write(&path, encode(&img, fmt)).expect("write test image");
            paths.push(path);
        }
    }
    paths
}

/// Names of this process's threads (Linux; empty elsewhere).
pub fn thread_names() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    dir.filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("comm")).ok())
        .map(|s| s.trim().to_string())
        .collect()
}

/// The loader threads (named `wick-...`) of this process.
pub fn wick_threads() -> Vec<String> {
    thread_names()
        .into_iter()
        .filter(|n| n.starts_with("wick-"))
        .collect()
}

/// The loader threads (named `wick-...`) of this process once at most
/// `expected` are left, or after a second (see [`settle`]).
pub fn wick_threads_settled(expected: usize) -> Vec<String> {
    settle(1, wick_threads, |now| now.len() <= expected)
}

/// `probe()` once `done` holds for it, or after `secs` seconds whatever it
/// is then. For counts of threads: a joined thread can still be listed in
/// `/proc/self/task` for a moment, since `pthread_join` returns when the
/// kernel clears the thread's id as it releases its memory, a little
/// before the task leaves the list, and on a loaded machine the gap grows.
/// A thread left behind (never joined) stays listed, so it is still caught.
pub fn settle<T>(secs: u64, mut probe: impl FnMut() -> T, done: impl Fn(&T) -> bool) -> T {
    let t = std::time::Instant::now();
    loop {
        let now = probe();
        if done(&now) || t.elapsed() > std::time::Duration::from_secs(secs) {
            return now;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// Runs `f` on a thread and returns its result; panics ("hang: watchdog
/// expired") if it has not finished within `secs`. A thread left hanging
/// does not stop the test binary from exiting.
pub fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(std::time::Duration::from_secs(secs))
        .expect("hang: watchdog expired")
}

/// A shard table of `count` made-up shards of `records` records each, for
/// a user `Source` that implements `shards()` (streaming-mode tests).
pub fn fake_shards(count: usize, records: usize) -> Vec<candle_wick::source::ShardInfo> {
    (0..count)
        .map(|s| candle_wick::source::ShardInfo {
            path: PathBuf::from(format!("shard{s}")),
            records,
            first: records * s,
        })
        .collect()
}

/// A batch's `u8` field `name`, flattened.
pub fn u8_field(b: &candle_wick::Batch, name: &str) -> Vec<u8> {
    b.get(name)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<u8>()
        .unwrap()
}

/// A `u8` batch's images, flattened.
pub fn pixels(b: &candle_wick::Batch) -> Vec<u8> {
    u8_field(b, "images")
}

/// A batch's class labels.
pub fn labels(b: &candle_wick::Batch) -> Vec<u32> {
    b.labels().unwrap().to_vec1::<u32>().unwrap()
}

/// 4,000 samples that each take 20 ms to read (the same small image): an
/// epoch takes minutes, so a prompt drop must really cancel queued work.
#[derive(Debug)]
pub struct Slow(pub Vec<u8>);

impl candle_wick::Source for Slow {
    fn len(&self) -> usize {
        4000
    }
    fn read(&self, index: usize) -> candle_wick::Result<candle_wick::source::Record> {
        std::thread::sleep(std::time::Duration::from_millis(20));
        Ok(candle_wick::source::Record::encoded(
            format!("slow{index}"),
            self.0.clone(),
            0,
        ))
    }
}

/// Runs `tests/fixtures/<script>` with `args` under `python3`: fixtures
/// written by the real writers (megatron-core, pyarrow, `datasets`).
/// `None` (the test skips, saying why) when the script fails because
/// Python or a package is missing; a panic instead when
/// `WICK_REQUIRE_FIXTURES` is set, as `.ci/run` sets it after installing
/// them, or when the script fails for another reason. Returns stdout.
pub fn python_fixture(script: &str, args: &[&str]) -> Option<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(script);
    let out = std::process::Command::new("python3")
        .arg(&path)
        .args(args)
        .output();
    let required = std::env::var_os("WICK_REQUIRE_FIXTURES").is_some();
    let missing = |why: String| {
        assert!(
            !required,
            "{script}: {why} (.ci/run installs what it needs)"
        );
        eprintln!("skipped: {script}: {why}");
        None
    };
    let out = match out {
        Ok(out) => out,
        Err(e) => return missing(format!("python3 does not run: {e}")),
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        if stderr.contains("ModuleNotFoundError") || stderr.contains("is not installed") {
            return missing(stderr.lines().last().unwrap_or_default().to_string());
        }
        panic!("{script} {args:?} failed:\n{stderr}");
    }
    Some(String::from_utf8(out.stdout).expect("UTF-8 output"))
}

/// A WebDataset shard of samples `first..first + samples` as tar bytes:
/// each a `.jpg` of `jpg_bytes` bytes plus 37 a sample (`i % 64`: sizes
/// vary), a `.cls` (`i % 10`) and a `.txt` caption.
pub fn wds_bytes(first: usize, samples: usize, jpg_bytes: usize) -> Vec<u8> {
    let mut tar = tar::Builder::new(Vec::new());
    for i in first..first + samples {
        let jpg = jpg_bytes + (i % 64) * 37;
        let members: [(&str, Vec<u8>); 3] = [
            ("jpg", (0..jpg).map(|b| ((b + i) % 251) as u8).collect()),
            ("cls", (i % 10).to_string().into_bytes()),
            ("txt", format!("a caption for sample {i}").into_bytes()),
        ];
        for (ext, data) in members {
            let mut header = tar::Header::new_ustar();
            header.set_size(data.len() as u64);
            header.set_mode(0o644);
            header.set_cksum();
            tar.append_data(&mut header, format!("{i:09}.{ext}"), &data[..])
                .unwrap();
        }
    }
    tar.into_inner().unwrap()
}

/// A small HTTP/1.1 object server on 127.0.0.1 for the remote tests:
/// `HEAD` and `GET` of its objects with their sizes and entity tags,
/// ranged GETs (`Range: bytes=a-b` and `a-`), `If-Match` (412 when the
/// object changed), `If-None-Match` (304 when it did not), bodies sent at most `rate` bytes a second (in 16 KiB
/// writes), and a stall: once it has sent `stall_after` bytes of bodies
/// in all, every body stops where it is (the connection stays open).
/// Objects can be replaced while it runs, by [`ObjectServer::put`] or a
/// `PUT` request (whose body is kept in memory). Each request is logged
/// (method, path, authorization header seen).
#[derive(Debug)]
pub struct ObjectServer {
    /// Its port.
    pub port: u16,
    state: std::sync::Arc<ServerState>,
}

#[derive(Debug, Default)]
struct ServerState {
    objects: std::sync::Mutex<std::collections::HashMap<String, Vec<u8>>>,
    /// Folders served under a path prefix, read from disk per request.
    folders: std::sync::Mutex<Vec<(String, std::path::PathBuf)>>,
    rate: std::sync::atomic::AtomicU64,
    stall_after: std::sync::atomic::AtomicU64,
    sent: std::sync::atomic::AtomicU64,
    log: std::sync::Mutex<Vec<String>>,
}

impl ObjectServer {
    /// A server of no objects, unthrottled.
    pub fn start() -> Self {
        use std::sync::atomic::Ordering::Relaxed;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = std::sync::Arc::new(ServerState::default());
        state.stall_after.store(u64::MAX, Relaxed);
        let st = state.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let st = st.clone();
                std::thread::spawn(move || serve(conn, &st));
            }
        });
        Self { port, state }
    }

    /// Puts (or replaces) object `path` (`/x/y.bin`).
    pub fn put(&self, path: &str, bytes: Vec<u8>) {
        self.state
            .objects
            .lock()
            .unwrap()
            .insert(path.to_string(), bytes);
    }

    /// Serves the files of folder `dir` (not its subfolders) as objects
    /// under `prefix` (`/ds` serves `dir/x.tar` as `/ds/x.tar`), each read
    /// from disk when asked for: the server holds none of them.
    pub fn put_dir(&self, prefix: &str, dir: &Path) {
        self.state.folders.lock().unwrap().push((
            format!("{}/", prefix.trim_end_matches('/')),
            dir.to_path_buf(),
        ));
    }

    /// Object `path` as it is now, when it was put (by [`Self::put`] or a
    /// `PUT` request).
    pub fn get(&self, path: &str) -> Option<Vec<u8>> {
        self.state.objects.lock().unwrap().get(path).cloned()
    }

    /// Bodies at most `bytes_per_sec` from now on.
    pub fn throttle(&self, bytes_per_sec: u64) {
        self.state
            .rate
            .store(bytes_per_sec, std::sync::atomic::Ordering::Relaxed);
    }

    /// Bodies stop after `bytes` from now on (the connection stays open).
    pub fn stall_after(&self, bytes: u64) {
        self.state
            .stall_after
            .store(bytes, std::sync::atomic::Ordering::Relaxed);
    }

    /// The URL of object `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Body bytes sent so far, over every request.
    pub fn bytes_sent(&self) -> u64 {
        self.state.sent.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The requests seen so far.
    pub fn log(&self) -> Vec<String> {
        self.state.log.lock().unwrap().clone()
    }
}

/// The entity tag of an object's bytes.
fn etag(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("\"{h:016x}-{}\"", bytes.len())
}

fn serve(conn: std::net::TcpStream, st: &ServerState) {
    use std::io::{BufRead, BufReader, Write};
    use std::sync::atomic::Ordering::Relaxed;
    // A response's head and body are separate writes: with Nagle's
    // algorithm the body would wait for the client's delayed ACK of the
    // head (some 40 ms a small response), which no object store makes a
    // client wait.
    let _ = conn.set_nodelay(true);
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut out = conn;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut parts = line.split_whitespace();
        let (method, path) = (
            parts.next().unwrap_or("").to_string(),
            parts.next().unwrap_or("").to_string(),
        );
        let mut headers = std::collections::HashMap::new();
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
            }
        }
        st.log.lock().unwrap().push(format!(
            "{method} {path} auth={:?}",
            headers.get("authorization")
        ));
        if method == "PUT" {
            let len: usize = headers
                .get("content-length")
                .and_then(|l| l.parse().ok())
                .unwrap_or(0);
            let mut body = vec![0; len];
            if std::io::Read::read_exact(&mut reader, &mut body).is_err() {
                return;
            }
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nETag: {}\r\n\r\n",
                etag(&body)
            );
            st.objects.lock().unwrap().insert(path, body);
            let _ = out.write_all(head.as_bytes());
            continue;
        }
        let mut object = st.objects.lock().unwrap().get(&path).cloned();
        if object.is_none() {
            let folders = st.folders.lock().unwrap().clone();
            object = folders.iter().find_map(|(prefix, dir)| {
                let name = path.strip_prefix(prefix.as_str())?;
                (!name.contains('/')).then(|| std::fs::read(dir.join(name)).ok())?
            });
        }
        let Some(object) = object else {
            let _ = out.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");
            continue;
        };
        let tag = etag(&object);
        if headers
            .get("if-match")
            .is_some_and(|m| *m != tag && m != "*")
        {
            let _ = out.write_all(b"HTTP/1.1 412 Precondition Failed\r\nContent-Length: 0\r\n\r\n");
            continue;
        }
        if headers.get("if-none-match").is_some_and(|m| *m == tag) {
            let head = format!("HTTP/1.1 304 Not Modified\r\nETag: {tag}\r\n\r\n");
            let _ = out.write_all(head.as_bytes());
            continue;
        }
        let len = object.len() as u64;
        let range = headers.get("range").and_then(|r| {
            let (a, b) = r.strip_prefix("bytes=")?.split_once('-')?;
            let a: u64 = a.parse().ok()?;
            let b: u64 = if b.is_empty() {
                len - 1
            } else {
                b.parse().ok()?
            };
            Some((a, b.min(len - 1)))
        });
        let (status, start, end) = match range {
            Some((a, b)) => ("206 Partial Content", a, b + 1),
            None => ("200 OK", 0, len),
        };
        let mut head = format!(
            "HTTP/1.1 {status}\r\nContent-Length: {}\r\nETag: {tag}\r\n\
             Last-Modified: Sun, 06 Dec 2026 00:00:00 GMT\r\nAccept-Ranges: bytes\r\n",
            end - start
        );
        if range.is_some() {
            head += &format!("Content-Range: bytes {start}-{}/{len}\r\n", end - 1);
        }
        head += "\r\n";
        if out.write_all(head.as_bytes()).is_err() {
            return;
        }
        if method == "HEAD" {
            continue;
        }
        let body = &object[start as usize..end as usize];
        let (rate, stall) = (st.rate.load(Relaxed), st.stall_after.load(Relaxed));
        let _ = out.flush();
        for chunk in body.chunks(16 << 10) {
            if st.sent.fetch_add(chunk.len() as u64, Relaxed) + chunk.len() as u64 > stall {
                // Stalled: the connection stays open, silent.
                std::thread::sleep(std::time::Duration::from_secs(3600));
                return;
            }
            if out.write_all(chunk).is_err() {
                return;
            }
            if rate > 0 {
                std::thread::sleep(std::time::Duration::from_secs_f64(
                    chunk.len() as f64 / rate as f64,
                ));
            }
        }
    }
}

/// A map that writes each record's label as its one field, `v` (`u32`).
pub fn label_map() -> impl candle_wick::map::Map {
    use candle_wick::fields::{Field, FieldType};
    candle_wick::map::map_fn(
        vec![Field::new("v", FieldType::U32, &[])],
        |s: &mut candle_wick::map::Sample<'_>| {
            s.take::<u32>(0)?[0] = s.record().label;
            Ok(())
        },
    )
}
