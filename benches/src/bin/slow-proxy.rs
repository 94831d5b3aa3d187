//! A TCP proxy on loopback that makes a local server look remote: every
//! request (each burst of bytes from the client, which is one HTTP/1.1
//! request: clients send the next one only after the answer) is held for
//! a fixed delay before it goes on, and the answers come back no faster
//! than a per-connection bandwidth cap (as one connection to S3 gives).
//!
//! `slow-proxy LISTEN UPSTREAM DELAY_MS MB_PER_S` (MB of 10^6 bytes; 0: no
//! cap), e.g. `slow-proxy 127.0.0.1:9100 127.0.0.1:9000 20 100`. Prints
//! `ready` once it listens, then runs until killed.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::time::{Duration, Instant};

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [listen, upstream, delay_ms, mbps] = &args[..] else {
        eprintln!("usage: slow-proxy LISTEN UPSTREAM DELAY_MS MB_PER_S");
        std::process::exit(2);
    };
    let number = |s: &str| -> f64 {
        s.parse().unwrap_or_else(|_| {
            eprintln!("slow-proxy: {s:?} is not a number");
            std::process::exit(2)
        })
    };
    let delay = Duration::from_secs_f64(number(delay_ms) / 1e3);
    let bytes_per_s = number(mbps) * 1e6;
    let listener = TcpListener::bind(listen)?;
    println!("ready");
    for client in listener.incoming() {
        let client = client?;
        let upstream = upstream.clone();
        std::thread::spawn(move || {
            if let Ok(server) = TcpStream::connect(&upstream) {
                connect(client, server, delay, bytes_per_s);
            }
        });
    }
    Ok(())
}

/// Relays one connection: requests held `delay`, answers paced.
fn connect(client: TcpStream, server: TcpStream, delay: Duration, bytes_per_s: f64) {
    let _ = (client.set_nodelay(true), server.set_nodelay(true));
    let (Ok(mut c_in), Ok(mut s_out)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    let requests = std::thread::spawn(move || {
        let mut buf = vec![0; 64 << 10];
        while let Ok(n @ 1..) = c_in.read(&mut buf) {
            std::thread::sleep(delay);
            if s_out.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = s_out.shutdown(Shutdown::Write);
    });
    let (mut s_in, mut c_out) = (server, client);
    let mut buf = vec![0; 64 << 10];
    let mut start = Instant::now();
    let mut sent = 0f64;
    while let Ok(n @ 1..) = s_in.read(&mut buf) {
        // An idle connection earns no burst: the schedule starts again.
        let due = Duration::from_secs_f64(sent / bytes_per_s.max(1.0));
        if start.elapsed() > due + Duration::from_millis(5) {
            (start, sent) = (Instant::now(), 0.0);
        }
        if c_out.write_all(&buf[..n]).is_err() {
            break;
        }
        sent += n as f64;
        if bytes_per_s > 0.0 {
            // Behind the cap's schedule: wait until the bytes sent are due.
            let due = Duration::from_secs_f64(sent / bytes_per_s);
            if let Some(wait) = due.checked_sub(start.elapsed()) {
                std::thread::sleep(wait);
            }
        }
    }
    let _ = c_out.shutdown(Shutdown::Write);
    let _ = requests.join();
}
