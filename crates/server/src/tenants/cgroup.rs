//! A tenant's CPU cgroup: the worker thread serving a tenant's session runs
//! in the tenant's cgroup for the turn, so the tenant's CPU share (its
//! `cpu.shares`, `cpu.cfs_quota_us`), not the agent's, bounds the agent's
//! work on its behalf (resource amplification).
//!
//! A thread is moved by writing its id to the cgroup's `tasks` file
//! (cgroup v1, as on this machine) or `cgroup.threads` (v2, which needs a
//! threaded subtree: documented, not run here), and moved back to the
//! agent's own cgroup (its *home*, from `/proc/self/cgroup` and the mount
//! table) at the end of the turn. Two writes a turn, a few µs: paid only by
//! tenants that name a `cpu_cgroup`.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// Whether any thread of this process was ever moved into a tenant's
/// cgroup (until then new threads need no moving home).
static PLACED: AtomicBool = AtomicBool::new(false);

/// A cgroup a thread can be moved into.
///
/// # Examples
///
/// A tenant's `cpu_cgroup` must be a cgroup directory:
///
/// ```
/// use server::tenants::cgroup::CpuCgroup;
/// let dir = tempfile::tempdir()?;
/// let e = CpuCgroup::open(dir.path()).unwrap_err();
/// assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
/// assert!(e.to_string().contains("not a cgroup directory"), "{e}");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct CpuCgroup {
    /// Its directory.
    pub path: PathBuf,
    /// Its `tasks` (v1) or `cgroup.threads` (v2) file, open for writing.
    threads: File,
}

impl CpuCgroup {
    /// Opens the cgroup at `dir` (a v1 `cpu` cgroup directory, or a v2
    /// threaded one) for moving threads into it. Example: [`CpuCgroup`].
    pub fn open(dir: &Path) -> io::Result<CpuCgroup> {
        let file = ["tasks", "cgroup.threads"]
            .iter()
            .map(|f| dir.join(f))
            .find(|p| p.is_file())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!(
                        "{} has no `tasks` or `cgroup.threads`: not a cgroup directory",
                        dir.display()
                    ),
                )
            })?;
        let threads = OpenOptions::new().write(true).open(&file)?;
        Ok(CpuCgroup {
            path: dir.to_path_buf(),
            threads,
        })
    }

    /// Moves the calling thread into this cgroup.
    ///
    /// # Examples
    ///
    /// Moving a thread into the cgroup it is in already (the agent's own),
    /// where a tenant's turn ends:
    ///
    /// ```no_run
    /// let home = server::tenants::cgroup::home()?;
    /// std::thread::spawn(move || home.enter()).join().unwrap()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn enter(&self) -> io::Result<()> {
        PLACED.store(true, Ordering::Relaxed);
        let tid = rustix::thread::gettid().as_raw_nonzero().get();
        (&self.threads).write_all(tid.to_string().as_bytes())
    }
}

/// For a thread just started: moves it to the agent's own cgroup if tenant
/// cgroups are in use (a thread starts in its creator's cgroup, and a
/// worker created during a tenant's turn would otherwise serve everyone
/// from the tenant's cgroup). Nothing to do, and no system call, before
/// any thread was placed.
///
/// # Examples
///
/// The first line of every worker thread the agent starts:
///
/// ```
/// let worker = std::thread::spawn(|| {
///     server::tenants::cgroup::start_at_home(); // no thread placed yet: nothing to do
///     2 + 2
/// });
/// assert_eq!(worker.join().unwrap(), 4);
/// ```
pub fn start_at_home() {
    if PLACED.load(Ordering::Relaxed) {
        if let Err(e) = home().and_then(|h| h.enter().map_err(|e| e.to_string())) {
            eprintln!("tensorwire agent: a new worker could not move to the agent's cgroup: {e}");
        }
    }
}

/// The agent's own CPU cgroup (where its threads go back after a turn), or
/// why it cannot be used.
///
/// # Examples
///
/// ```no_run
/// let home = server::tenants::cgroup::home()?;
/// println!("the agent's threads go back to {}", home.path.display());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn home() -> Result<&'static CpuCgroup, String> {
    static HOME: OnceLock<Result<CpuCgroup, String>> = OnceLock::new();
    HOME.get_or_init(|| {
        let dir = home_dir()?;
        CpuCgroup::open(&dir).map_err(|e| format!("the agent's own cpu cgroup: {e}"))
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// The directory of this process's CPU cgroup: the v1 `cpu` hierarchy's
/// mount point joined with this process's path in it, else the v2 one.
fn home_dir() -> Result<PathBuf, String> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup")
        .map_err(|e| format!("cannot read /proc/self/cgroup: {e}"))?;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?;
    find_home(&cgroups, &mounts)
        .ok_or_else(|| "no cpu cgroup (v1) or cgroup2 mount found for this process".to_string())
}

/// [`home_dir`] from the text of `/proc/self/cgroup` and
/// `/proc/self/mountinfo`.
fn find_home(cgroups: &str, mountinfo: &str) -> Option<PathBuf> {
    // mountinfo: ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS ... - FSTYPE SOURCE SUPEROPTS
    let mounts: Vec<(String, String, String, String)> = mountinfo
        .lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let pre: Vec<&str> = pre.split(' ').collect();
            let post: Vec<&str> = post.split(' ').collect();
            Some((
                pre.get(3)?.to_string(),
                pre.get(4)?.to_string(),
                post.first()?.to_string(),
                post.get(2).unwrap_or(&"").to_string(),
            ))
        })
        .collect();
    let join = |mount: &str, root: &str, path: &str| {
        let rel = path.strip_prefix(root).unwrap_or(path);
        Path::new(mount).join(rel.trim_start_matches('/'))
    };
    // v1: "N:cpu,cpuacct:/path" with a cgroup mount whose options name cpu.
    for line in cgroups.lines() {
        let mut f = line.splitn(3, ':');
        let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
        if controllers.split(',').any(|c| c == "cpu") {
            let (root, mount, ..) = mounts
                .iter()
                .find(|(_, _, fs, opts)| fs == "cgroup" && opts.split(',').any(|o| o == "cpu"))?;
            return Some(join(mount, root, path));
        }
    }
    // v2: "0::/path" with the cgroup2 mount.
    let path = cgroups.lines().find_map(|l| l.strip_prefix("0::"))?;
    let (root, mount, ..) = mounts.iter().find(|(_, _, fs, _)| fs == "cgroup2")?;
    Some(join(mount, root, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTS: &str = "\
25 1 0:22 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755
31 25 0:27 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
32 25 0:28 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
40 25 0:35 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
";

    #[test]
    fn the_home_is_the_cpu_hierarchy_s_mount_and_this_process_s_path() {
        let cg = "4:memory:/x\n1:cpu:/agents/tw\n0::/\n";
        assert_eq!(
            find_home(cg, MOUNTS),
            Some(PathBuf::from("/sys/fs/cgroup/cpu/agents/tw"))
        );
        assert_eq!(
            find_home("1:cpu:/\n", MOUNTS),
            Some(PathBuf::from("/sys/fs/cgroup/cpu"))
        );
        // Combined controllers name cpu too.
        let combined = MOUNTS.replace("rw,cpu\n", "rw,cpu,cpuacct\n");
        assert_eq!(
            find_home("2:cpu,cpuacct:/a\n", &combined),
            Some(PathBuf::from("/sys/fs/cgroup/cpu/a"))
        );
        // v2 only.
        assert_eq!(
            find_home("0::/svc/tw\n", MOUNTS),
            Some(PathBuf::from("/sys/fs/cgroup/unified/svc/tw"))
        );
        assert_eq!(find_home("", MOUNTS), None);
    }

    #[test]
    fn a_directory_without_a_threads_file_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let e = CpuCgroup::open(d.path()).unwrap_err().to_string();
        assert!(e.contains("not a cgroup directory"), "{e}");
    }
}
