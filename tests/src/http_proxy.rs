//! A real forwarding HTTP proxy for the tests: proxy.py (PyPI `proxy.py`,
//! in the tests' virtual environment), on an ephemeral port of 127.0.0.1,
//! its access log a file: one line per request it forwards, such as
//! `127.0.0.1:40112 - POST 127.0.0.1:35071/ - 200 OK - 1234 bytes - 5.2ms`.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::wait_until;

/// proxy.py, running until dropped.
pub struct HttpProxy {
    child: Child,
    dir: tempfile::TempDir,
    /// `http://127.0.0.1:<port>`, as `HTTP_PROXY` names a proxy.
    pub url: String,
}

impl HttpProxy {
    /// Starts proxy.py and waits until it has a port.
    pub fn start() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("ebs-csi-proxy-")
            .tempdir()
            .expect("tempdir");
        let port_file = dir.path().join("port");
        let child = Command::new(crate::venv_program("proxy"))
            .args(["--hostname", "127.0.0.1", "--port", "0", "--num-workers", "1"])
            .arg("--port-file")
            .arg(&port_file)
            .arg("--log-file")
            .arg(dir.path().join("access.log"))
            .args(["--log-level", "INFO"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Its workers are processes of their own: one group, ended
            // together.
            .process_group(0)
            .spawn()
            .expect("proxy.py");
        wait_until("proxy.py's port", Duration::from_secs(30), || {
            std::fs::read_to_string(&port_file).is_ok_and(|p| !p.trim().is_empty())
        });
        let port = std::fs::read_to_string(&port_file).expect("port file");
        Self {
            child,
            url: format!("http://127.0.0.1:{}", port.trim()),
            dir,
        }
    }

    /// The access log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("access.log")
    }
}

impl Drop for HttpProxy {
    /// Ends proxy.py and its workers (its process group), and waits for it.
    fn drop(&mut self) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
        let _ = self.child.wait();
    }
}
