use std::process::Command;

/// Runs this test binary's test `name` alone in a child process with
/// `WICK_SIGBUS_CHILD` set to `mode`.
/// Its status, once it ran that one test (a child that ends by a
/// signal ran it; one that exits must say it passed one test).
fn child(name: &str, mode: &str) -> std::process::ExitStatus {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--test-threads=1", "--nocapture"])
        .env("WICK_SIGBUS_CHILD", mode)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.code().is_none() || text.contains("1 passed"),
        "the child did not run {name}: {text}"
    );
    out.status
}

/// In the child: the disposition before the guard is `mode`'s, then
/// the guard is installed and the process sends itself SIGBUS (once
/// under the default action, which must end it; twice when ignored,
/// which must not).
fn send(mode: &str) {
    // SAFETY: a zeroed sigaction with SIG_DFL or SIG_IGN, set before
    // any other thread of this child's test touches SIGBUS; kill and
    // getpid have no preconditions.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = if mode == "ign" {
            libc::SIG_IGN
        } else {
            libc::SIG_DFL
        };
        libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut());
        assert!(super::imp::install());
        for _ in 0..if mode == "ign" { 2 } else { 1 } {
            libc::kill(libc::getpid(), libc::SIGBUS);
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

/// Review #14: a SIGBUS another process sends is not ours. With the
/// default action before the guard it still ends the process (it was
/// swallowed, and the guard uninstalled); ignored before, it stays
/// ignored (the first one reset the action, and the second killed).
#[test]
fn a_sent_sigbus_keeps_the_action_the_program_had() {
    const NAME: &str = "storage::mmap::tests::a_sent_sigbus_keeps_the_action_the_program_had";
    if let Ok(mode) = std::env::var("WICK_SIGBUS_CHILD") {
        send(&mode);
        return;
    }
    use std::os::unix::process::ExitStatusExt;
    let dfl = child(NAME, "dfl");
    assert_eq!(dfl.signal(), Some(libc::SIGBUS), "default action: {dfl:?}");
    let ign = child(NAME, "ign");
    assert!(ign.success(), "ignored before: {ign:?}");
}

/// Review #14(c): a program that blocks SIGBUS (to `sigwait` in one
/// thread, say) before building a loader: the loader's threads inherit
/// the mask, and a fault on a thread that blocks SIGBUS takes the
/// default action whatever the handler. They unblock it, so a token
/// file cut short is still bad samples, not the end of the process.
#[test]
fn a_blocked_sigbus_does_not_defeat_the_guard_on_the_loaders_threads() {
    const NAME: &str = "storage::mmap::tests::\
                        a_blocked_sigbus_does_not_defeat_the_guard_on_the_loaders_threads";
    if std::env::var("WICK_SIGBUS_CHILD").is_ok() {
        use crate::map::TokenWindowsMap;
        use crate::source::{TokenFile, TokenSource, WindowOrder};
        // SAFETY: a set built by sigemptyset/sigaddset; pthread_sigmask
        // changes only this thread's mask (inherited by threads it
        // spawns from now on).
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGBUS);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.bin");
        // No token below 256: no read ends in a zero byte, so the cut
        // is met by a fault (not by the size check).
        let bytes: Vec<u8> = (0..65_536u32)
            .flat_map(|i| (i as u16 | 0x8000).to_le_bytes())
            .collect();
        std::fs::write(&path, bytes).unwrap();
        let src = TokenSource::new(
            vec![TokenFile::open(&path).unwrap()],
            64,
            WindowOrder::NonOverlapping,
        )
        .unwrap();
        let mut l = crate::pipeline::Loader::builder(src.clone())
            .map(TokenWindowsMap::new(&src))
            .batch_size(4)
            .workers(2)
            .bad_samples(crate::pipeline::BadSamples::Skip)
            .shard(0, 1)
            .build()
            .unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(4096)
            .unwrap();
        let skipped: usize = l.epoch(0).map(|b| b.unwrap().skipped.len()).sum();
        // Windows 0-30 lie in the first page, which the file keeps.
        assert!(skipped > 0 && skipped < 1023, "{skipped} skipped");
        return;
    }
    let status = child(NAME, "blocked");
    assert!(status.success(), "the child died: {status:?}");
}
