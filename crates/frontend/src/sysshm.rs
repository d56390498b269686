//! [`SystemShm`]: Triton's *system shared-memory* extension for the KServe
//! front doors. It owns the registry of regions clients registered (name →
//! a mapping of part of a POSIX shared-memory object), the checks a
//! registration goes through, the `shared_memory_*` tensor parameters of an
//! inference, and the leases that let a request read its inputs from a
//! region and write its outputs into one without a copy.
//!
//! One registry serves every front door of an agent (it lives in
//! [`FrontDoor`](crate::FrontDoor)): a region registered over HTTP is used
//! over gRPC and the other way round.
//!
//! **Registering** `(name, key, offset, byte_size)` opens `/dev/shm/<key>`
//! (the key's leading slashes dropped, as `shm_open` does; a symbolic link
//! is refused), checks the object and maps `[offset, offset + byte_size)`
//! of it read-write, shared (memmap2 aligns the offset down to a page). The
//! object must be:
//!
//! - a regular file whose size covers `offset + byte_size`;
//! - **owned by the agent's effective user** and **writable by no other
//!   user** (no group or other write bit). The key comes from a client that
//!   may be remote: without the first rule it could make the agent map (and,
//!   through `identity`, send back) another user's memory; without the
//!   second, another user could shrink the object under the agent's mapping
//!   and crash it (a read past the end of a shrunk object is a SIGBUS).
//!   Python's `multiprocessing.shared_memory`, which
//!   `tritonclient.utils.shared_memory` uses, creates objects with mode
//!   0600, so stock clients pass.
//!
//! The one thing the agent cannot rule out is its *own* user shrinking an
//! object it mapped (`ftruncate`): POSIX shared memory, unlike the sealed
//! memfds of tensorwire's native `shm://` sessions, cannot be sealed. That
//! user can kill the agent anyway; nothing else can.
//!
//! A region is held in an [`Arc`]: unregistering removes the name at once,
//! and the mapping is unmapped when the last request using it finishes.
//!
//! **Using a region** (the `shared_memory_region`, `shared_memory_byte_size`
//! and `shared_memory_offset` parameters of an input or requested output,
//! [`ShmRef`]): the bytes `[offset, offset + byte_size)` must lie inside the
//! region. An input's bytes are read in place (as `&[u8]`, the convention
//! the agent follows for every memory a client can write: its values are
//! untrusted, its bounds are not); an output is written there. Within one
//! agent, a request *leases* the ranges it uses before it runs: reads share,
//! a write excludes every other use of its bytes, so no two requests (nor
//! one request's input and output) ever hold overlapping bytes where one of
//! them writes. A request whose output overlaps one of its own tensors is
//! refused; one that overlaps another request's waits for it (up to 30 s).
//! Two regions over the same bytes of one object are separate mappings, and
//! are treated like another process's view of them.

use crate::proto::infer_parameter::ParameterChoice;
use crate::proto::InferParameter;
use bytes::Bytes;
use memmap2::{MmapOptions, MmapRaw};
use rustix::fs::{FileType, Mode, OFlags};
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tonic::Status;

/// The longest region name accepted, in bytes.
pub const MAX_NAME_LEN: usize = 256;

/// The most regions registered at once (each is a mapping in the agent).
pub const MAX_REGIONS: usize = 1024;

/// The longest object name `shm_open` takes (Linux `NAME_MAX`).
const MAX_KEY_LEN: usize = 255;

/// Where POSIX shared-memory objects live (as for glibc's `shm_open`).
const SHM_DIR: &str = "/dev/shm";

/// How long a request waits for another request to stop using bytes it
/// wants to write (or read, where the other writes).
const LEASE_WAIT: Duration = Duration::from_secs(30);

/// The tensor parameter naming a registered region.
pub const PARAM_REGION: &str = "shared_memory_region";
/// The tensor parameter giving the tensor's bytes in the region.
pub const PARAM_BYTE_SIZE: &str = "shared_memory_byte_size";
/// The tensor parameter giving where in the region the tensor starts.
pub const PARAM_OFFSET: &str = "shared_memory_offset";

/// The registered system shared-memory regions of one agent.
pub struct SystemShm {
    regions: Mutex<BTreeMap<String, Arc<Region>>>,
    leases: Arc<LeaseTable>,
    next_id: AtomicU64,
    lease_wait: Duration,
}

impl fmt::Debug for SystemShm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<String> = self.lock().keys().cloned().collect();
        f.debug_struct("SystemShm")
            .field("regions", &names)
            .finish_non_exhaustive()
    }
}

impl Default for SystemShm {
    fn default() -> SystemShm {
        SystemShm::with_lease_wait(LEASE_WAIT)
    }
}

/// One registered region: part of a shared-memory object, mapped.
struct Region {
    /// Unique for the agent's life (names can be registered again).
    id: u64,
    name: String,
    key: String,
    offset: u64,
    /// The mapping: `byte_size` bytes from `offset` of the object.
    map: MmapRaw,
}

impl Region {
    fn byte_size(&self) -> u64 {
        self.map.len() as u64
    }
}

/// What status reports of a region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionStatus {
    /// The name it was registered under.
    pub name: String,
    /// The key of its shared-memory object, as given.
    pub key: String,
    /// Where in the object it starts.
    pub offset: u64,
    /// Its size in bytes.
    pub byte_size: u64,
}

/// Where a tensor of a request lies in a registered region (its
/// `shared_memory_*` parameters).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShmRef {
    /// The region's name.
    pub region: String,
    /// The tensor's first byte, from the region's start.
    pub offset: u64,
    /// The bytes given to the tensor.
    pub byte_size: u64,
}

impl SystemShm {
    /// An empty registry whose requests wait up to `lease_wait` for bytes
    /// another request is using.
    pub fn with_lease_wait(lease_wait: Duration) -> SystemShm {
        SystemShm {
            regions: Mutex::new(BTreeMap::new()),
            leases: Arc::new(LeaseTable::default()),
            next_id: AtomicU64::new(1),
            lease_wait,
        }
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Arc<Region>>> {
        self.regions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers `[offset, offset + byte_size)` of the object `key` as
    /// region `name`, after the checks the module documentation lists.
    pub fn register(
        &self,
        name: &str,
        key: &str,
        offset: u64,
        byte_size: u64,
    ) -> Result<(), Status> {
        check_name(name)?;
        let path = object_path(key)?;
        let fail = |m: String| format!("failed to register shared memory region '{name}': {m}");
        if byte_size == 0 {
            return Err(Status::invalid_argument(fail(
                "byte_size must be greater than 0".into(),
            )));
        }
        let end = offset.checked_add(byte_size).ok_or_else(|| {
            Status::invalid_argument(fail(format!(
                "offset {offset} + byte_size {byte_size} overflows"
            )))
        })?;
        let len = usize::try_from(byte_size).map_err(|_| {
            Status::invalid_argument(fail(format!("byte_size {byte_size} is too large")))
        })?;
        self.check_room(name)?;
        let fd = rustix::fs::open(
            &path,
            OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NOCTTY,
            Mode::empty(),
        )
        .map_err(|e| open_error(name, key, e))?;
        let st = rustix::fs::fstat(&fd)
            .map_err(|e| Status::internal(fail(format!("cannot stat the object '{key}': {e}"))))?;
        check_object(
            key,
            st.st_mode,
            st.st_uid,
            rustix::process::geteuid().as_raw(),
        )
        .map_err(|m| Status::permission_denied(fail(m)))?;
        let size = u64::try_from(st.st_size).unwrap_or(0);
        if end > size {
            return Err(Status::invalid_argument(fail(format!(
                "bytes {offset}..{end} fall outside the shared memory object '{key}', which \
                 holds {size} bytes"
            ))));
        }
        let file = File::from(fd);
        let map = MmapOptions::new()
            .offset(offset)
            .len(len)
            .map_raw(&file)
            .map_err(|e| Status::internal(fail(format!("cannot map '{key}': {e}"))))?;
        drop(file);
        let region = Arc::new(Region {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            name: name.to_string(),
            key: key.to_string(),
            offset,
            map,
        });
        let mut regions = self.lock();
        // Checked again: another call may have registered it meanwhile.
        if regions.contains_key(name) {
            return Err(already(name));
        }
        if regions.len() >= MAX_REGIONS {
            return Err(too_many());
        }
        regions.insert(name.to_string(), region);
        Ok(())
    }

    /// Refuses a name in use, or a full registry, before any system call.
    fn check_room(&self, name: &str) -> Result<(), Status> {
        let regions = self.lock();
        if regions.contains_key(name) {
            return Err(already(name));
        }
        if regions.len() >= MAX_REGIONS {
            return Err(too_many());
        }
        Ok(())
    }

    /// Unregisters `name` (an unknown name is not an error, as in Triton).
    /// Requests using it finish; it is unmapped after the last one.
    pub fn unregister(&self, name: &str) {
        // Unmapped (if no request uses it) after the lock is released.
        let gone = self.lock().remove(name);
        drop(gone);
    }

    /// Unregisters every region.
    pub fn unregister_all(&self) {
        let gone = std::mem::take(&mut *self.lock());
        drop(gone);
    }

    /// The status of region `name`, or of every region (by name) when
    /// `name` is `None`; an unknown name is NOT_FOUND.
    pub fn status(&self, name: Option<&str>) -> Result<Vec<RegionStatus>, Status> {
        let regions = self.lock();
        let one = |r: &Region| RegionStatus {
            name: r.name.clone(),
            key: r.key.clone(),
            offset: r.offset,
            byte_size: r.byte_size(),
        };
        match name {
            None => Ok(regions.values().map(|r| one(r)).collect()),
            Some(n) => regions.get(n).map(|r| vec![one(r)]).ok_or_else(|| {
                Status::not_found(format!("Unable to find system shared memory region: '{n}'"))
            }),
        }
    }

    /// Leases the bytes of a request's tensors in their regions: `inputs`
    /// to read, `outputs` to write, each named (`"input 'x'"`) for errors.
    /// Checks that each lies inside its region and that no output overlaps
    /// another tensor of the request, then waits (up to the lease wait)
    /// until no request in flight writes where this one reads or uses
    /// bytes this one writes. Returns the inputs' bytes, read in place
    /// (each keeps the lease and the mapping alive), and the outputs'
    /// writable bytes, in the order given.
    pub fn lease(
        &self,
        inputs: &[(String, ShmRef)],
        outputs: &[(String, ShmRef)],
    ) -> Result<(Vec<Bytes>, Vec<ShmOutput>), Status> {
        if inputs.is_empty() && outputs.is_empty() {
            return Ok((Vec::new(), Vec::new()));
        }
        let mut wants = Vec::with_capacity(inputs.len() + outputs.len());
        {
            let regions = self.lock();
            let tensors = inputs
                .iter()
                .map(|t| (t, false))
                .chain(outputs.iter().map(|t| (t, true)));
            for ((what, at), write) in tensors {
                let region = regions.get(&at.region).cloned().ok_or_else(|| {
                    Status::not_found(format!(
                        "{what}: Unable to find system shared memory region: '{}' \
                         (register it first)",
                        at.region
                    ))
                })?;
                let end = at
                    .offset
                    .checked_add(at.byte_size)
                    .filter(|&e| e <= region.byte_size())
                    .ok_or_else(|| {
                        Status::invalid_argument(format!(
                            "{what}: bytes {}..+{} (shared_memory_offset + \
                             shared_memory_byte_size) fall outside shared memory region '{}', \
                             which holds {} bytes",
                            at.offset,
                            at.byte_size,
                            at.region,
                            region.byte_size()
                        ))
                    })?;
                wants.push(Want {
                    what,
                    region,
                    range: Range {
                        start: at.offset,
                        end,
                        write,
                    },
                });
            }
        }
        for (i, a) in wants.iter().enumerate() {
            for b in &wants[..i] {
                if a.region.id == b.region.id && a.range.conflicts(&b.range) {
                    return Err(Status::invalid_argument(format!(
                        "{} and {} overlap in shared memory region '{}' (bytes {}..{} and \
                         {}..{}): an output's bytes must not overlap any other tensor's",
                        b.what,
                        a.what,
                        a.region.name,
                        b.range.start,
                        b.range.end,
                        a.range.start,
                        a.range.end
                    )));
                }
            }
        }
        let ticket = Arc::new(self.leases.acquire(&wants, self.lease_wait)?);
        let mut ins = Vec::with_capacity(inputs.len());
        let mut outs = Vec::with_capacity(outputs.len());
        for w in wants {
            // In bounds (checked above), so these fit usize: the mapping
            // holds `byte_size` bytes.
            let start = usize::try_from(w.range.start).unwrap_or(usize::MAX);
            let len = usize::try_from(w.range.end - w.range.start).unwrap_or(0);
            if w.range.write {
                outs.push(ShmOutput {
                    region: w.region,
                    start,
                    len,
                    _ticket: ticket.clone(),
                });
            } else {
                ins.push(Bytes::from_owner(ShmInput {
                    region: w.region,
                    start,
                    len,
                    _ticket: ticket.clone(),
                }));
            }
        }
        Ok((ins, outs))
    }

    #[cfg(test)]
    fn region(&self, name: &str) -> Option<Arc<Region>> {
        self.lock().get(name).cloned()
    }
}

fn already(name: &str) -> Status {
    Status::already_exists(format!("shared memory region '{name}' already in manager"))
}

fn too_many() -> Status {
    Status::resource_exhausted(format!(
        "the agent already holds its maximum of {MAX_REGIONS} shared memory regions; \
         unregister some first"
    ))
}

/// A region name: not empty, at most [`MAX_NAME_LEN`] bytes, no control
/// characters.
fn check_name(name: &str) -> Result<(), Status> {
    if name.is_empty() || name.len() > MAX_NAME_LEN || name.chars().any(char::is_control) {
        return Err(Status::invalid_argument(format!(
            "bad shared memory region name {name:?}: it must be 1 to {MAX_NAME_LEN} bytes, \
             without control characters"
        )));
    }
    Ok(())
}

/// The file of the POSIX shared-memory object `key` (`/name`; leading
/// slashes are dropped, as `shm_open` does), or why the key is not one.
fn object_path(key: &str) -> Result<PathBuf, Status> {
    let name = key.trim_start_matches('/');
    if name.is_empty()
        || name == "."
        || name == ".."
        || name.contains(['/', '\0'])
        || name.len() > MAX_KEY_LEN
    {
        return Err(Status::invalid_argument(format!(
            "bad shared memory key {key:?}: a POSIX shared memory object is named '/name', \
             with a name of 1 to {MAX_KEY_LEN} bytes, no other '/', not '.' or '..'"
        )));
    }
    Ok(PathBuf::from(SHM_DIR).join(name))
}

/// Why the object behind `key` cannot be opened, as a status.
fn open_error(name: &str, key: &str, e: rustix::io::Errno) -> Status {
    use rustix::io::Errno;
    let m = format!("failed to register shared memory region '{name}': ");
    match e {
        Errno::NOENT => Status::not_found(format!(
            "{m}no shared memory object with key '{key}' exists (create it first, e.g. with \
             tritonclient.utils.shared_memory.create_shared_memory_region)"
        )),
        Errno::LOOP => Status::permission_denied(format!(
            "{m}the shared memory key '{key}' is a symbolic link, which the agent does not follow"
        )),
        Errno::ACCESS | Errno::PERM => Status::permission_denied(format!(
            "{m}the agent may not open the shared memory object '{key}' read-write ({e})"
        )),
        _ => Status::invalid_argument(format!(
            "{m}cannot open the shared memory object '{key}': {e}"
        )),
    }
}

/// The owner rule (module documentation): a regular file, owned by
/// `euid`, writable by no group or other user.
fn check_object(key: &str, mode: u32, uid: u32, euid: u32) -> Result<(), String> {
    if FileType::from_raw_mode(mode) != FileType::RegularFile {
        return Err(format!(
            "'{key}' is not a shared memory object (not a regular file)"
        ));
    }
    if uid != euid {
        return Err(format!(
            "the shared memory object '{key}' is another user's (owner uid {uid}; the agent \
             runs as uid {euid}): the agent maps only objects of its own user"
        ));
    }
    if mode & 0o022 != 0 {
        return Err(format!(
            "the shared memory object '{key}' is writable by other users (mode {:o}), who \
             could resize it under the agent: create it with mode 600 (as Python's \
             multiprocessing.shared_memory does)",
            mode & 0o777
        ));
    }
    Ok(())
}

/// The `shared_memory_*` parameters of tensor `name` (`kind`: `"input"`
/// or `"output"`), if it names a region: the region as a string, the byte
/// size (required with it) and the offset (default 0) as non-negative
/// integers; either number without the region is refused.
pub fn shm_ref(
    kind: &str,
    name: &str,
    params: &HashMap<String, InferParameter>,
) -> Result<Option<ShmRef>, Status> {
    if params.is_empty() {
        return Ok(None);
    }
    let what = format_args!("{kind} '{name}'");
    let number = |key: &str| -> Result<Option<u64>, Status> {
        let Some(p) = params.get(key) else {
            return Ok(None);
        };
        let n = match p.parameter_choice {
            Some(ParameterChoice::Int64Param(n)) => u64::try_from(n).ok(),
            Some(ParameterChoice::Uint64Param(n)) => Some(n),
            _ => None,
        };
        n.map(Some).ok_or_else(|| {
            Status::invalid_argument(format!(
                "{what}: parameter '{key}' must be a non-negative integer"
            ))
        })
    };
    let offset = number(PARAM_OFFSET)?;
    let byte_size = number(PARAM_BYTE_SIZE)?;
    let Some(p) = params.get(PARAM_REGION) else {
        if offset.is_some() || byte_size.is_some() {
            return Err(Status::invalid_argument(format!(
                "{what}: '{PARAM_OFFSET}' and '{PARAM_BYTE_SIZE}' need '{PARAM_REGION}'"
            )));
        }
        return Ok(None);
    };
    let Some(ParameterChoice::StringParam(region)) = &p.parameter_choice else {
        return Err(Status::invalid_argument(format!(
            "{what}: parameter '{PARAM_REGION}' must be a string"
        )));
    };
    let byte_size = byte_size.ok_or_else(|| {
        Status::invalid_argument(format!(
            "{what}: '{PARAM_BYTE_SIZE}' must be given with '{PARAM_REGION}'"
        ))
    })?;
    Ok(Some(ShmRef {
        region: region.clone(),
        offset: offset.unwrap_or(0),
        byte_size,
    }))
}

/// An input's bytes in a region, read in place; holds its lease and the
/// mapping (the `owner` of a [`Bytes`]).
struct ShmInput {
    region: Arc<Region>,
    start: usize,
    len: usize,
    _ticket: Arc<Ticket>,
}

impl AsRef<[u8]> for ShmInput {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `start..start + len` lies inside the mapping (checked
        // against its size when leased), which lives as long as `self`
        // (the `Arc<Region>`) and is backed (its object covered it when
        // registered; only the object's owner could shrink it, see the
        // module documentation). Any byte pattern is a valid `u8`. The
        // client may write these bytes at any time: like every memory a
        // client can write, the agent treats the values as untrusted. No
        // thread of this process writes them while this read lease lives
        // (writes need a lease that excludes it).
        unsafe { std::slice::from_raw_parts(self.region.map.as_ptr().add(self.start), self.len) }
    }
}

/// An output's bytes in a region, leased for writing.
pub struct ShmOutput {
    region: Arc<Region>,
    start: usize,
    len: usize,
    _ticket: Arc<Ticket>,
}

impl fmt::Debug for ShmOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShmOutput")
            .field("region", &self.region.name)
            .field("start", &self.start)
            .field("len", &self.len)
            .finish()
    }
}

impl ShmOutput {
    /// The bytes given to the output (`shared_memory_byte_size`).
    pub fn capacity(&self) -> usize {
        self.len
    }

    /// The region's name.
    pub fn region(&self) -> &str {
        &self.region.name
    }

    /// Where the output starts in the region.
    pub fn offset(&self) -> u64 {
        self.start as u64
    }

    /// The output's bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: in bounds of a live, backed mapping, as for
        // `ShmInput::as_ref`. This output's write lease excludes every
        // other lease on these bytes, so nothing else in this process
        // reads or writes them while it lives, and `&mut self` makes this
        // the only slice made from it at a time. The client process may
        // still write them: it can only garble its own output.
        unsafe {
            std::slice::from_raw_parts_mut(self.region.map.as_mut_ptr().add(self.start), self.len)
        }
    }
}

/// A byte range of a region a request uses.
#[derive(Debug, Clone, Copy)]
struct Range {
    start: u64,
    end: u64,
    write: bool,
}

impl Range {
    /// Overlapping bytes where at least one side writes.
    fn conflicts(&self, other: &Range) -> bool {
        (self.write || other.write) && self.start < other.end && other.start < self.end
    }
}

/// A tensor's range, resolved to its region.
struct Want<'a> {
    what: &'a str,
    region: Arc<Region>,
    range: Range,
}

/// The ranges requests in flight hold, by request.
#[derive(Default)]
struct LeaseTable {
    held: Mutex<Held>,
    freed: Condvar,
}

#[derive(Default)]
struct Held {
    next: u64,
    /// (ticket, region id, range).
    ranges: Vec<(u64, u64, Range)>,
}

impl LeaseTable {
    fn lock(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes all of `wants` at once, when none conflicts with a range held;
    /// waits up to `wait` for that.
    fn acquire(self: &Arc<Self>, wants: &[Want<'_>], wait: Duration) -> Result<Ticket, Status> {
        let deadline = Instant::now() + wait;
        let mut held = self.lock();
        loop {
            let busy = wants.iter().find(|w| {
                held.ranges
                    .iter()
                    .any(|(_, id, r)| *id == w.region.id && r.conflicts(&w.range))
            });
            let Some(busy) = busy else { break };
            let now = Instant::now();
            if now >= deadline {
                return Err(Status::unavailable(format!(
                    "{}: bytes {}..{} of shared memory region '{}' are in use by another request \
                     in flight, which did not finish within {} s",
                    busy.what,
                    busy.range.start,
                    busy.range.end,
                    busy.region.name,
                    wait.as_secs_f32()
                )));
            }
            held = self
                .freed
                .wait_timeout(held, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        held.next += 1;
        let id = held.next;
        for w in wants {
            held.ranges.push((id, w.region.id, w.range));
        }
        Ok(Ticket {
            table: self.clone(),
            id,
        })
    }
}

/// One request's leases, released when dropped.
struct Ticket {
    table: Arc<LeaseTable>,
    id: u64,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut held = self.table.lock();
        held.ranges.retain(|(t, _, _)| *t != self.id);
        drop(held);
        self.table.freed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::OwnedFd;
    use tonic::Code;

    /// A POSIX shared-memory object for one test, unlinked when dropped.
    struct Object {
        key: String,
        fd: OwnedFd,
    }

    impl Object {
        fn new(tag: &str, len: u64) -> Object {
            let key = format!("/tw-sysshm-{}-{tag}", std::process::id());
            let path = object_path(&key).expect("key");
            let _ = std::fs::remove_file(&path);
            let fd = rustix::fs::open(
                &path,
                OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            )
            .expect("create the object");
            // The umask may have taken bits away; set exactly 0600.
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o600)).expect("chmod");
            rustix::fs::ftruncate(&fd, len).expect("size");
            Object { key, fd }
        }

        fn read(&self, offset: u64, len: usize) -> Vec<u8> {
            let mut b = vec![0u8; len];
            let n = rustix::io::pread(&self.fd, &mut b, offset).expect("pread");
            assert_eq!(n, len);
            b
        }
    }

    impl Drop for Object {
        fn drop(&mut self) {
            if let Ok(p) = object_path(&self.key) {
                let _ = std::fs::remove_file(p);
            }
        }
    }

    fn at(region: &str, offset: u64, byte_size: u64) -> ShmRef {
        ShmRef {
            region: region.into(),
            offset,
            byte_size,
        }
    }

    fn code(r: Result<(), Status>) -> (Code, String) {
        let e = r.expect_err("refused");
        (e.code(), e.message().to_string())
    }

    #[test]
    fn keys_and_names() {
        for good in ["/x", "x", "//x", "/input_data.1"] {
            assert!(object_path(good).is_ok(), "{good}");
        }
        assert_eq!(object_path("//x").unwrap(), PathBuf::from("/dev/shm/x"));
        let long = format!("/{}", "k".repeat(256));
        for bad in ["", "/", "//", "/a/b", "/.", "/..", "/a\0b", long.as_str()] {
            let e = object_path(bad).expect_err(bad);
            assert_eq!(e.code(), Code::InvalidArgument, "{bad}");
        }
        assert!(check_name("out0").is_ok());
        for bad in [String::new(), "n".repeat(MAX_NAME_LEN + 1), "a\nb".into()] {
            assert!(check_name(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_owner_rule() {
        let reg = 0o100_000;
        assert!(check_object("/k", reg | 0o600, 1000, 1000).is_ok());
        assert!(check_object("/k", reg | 0o644, 1000, 1000).is_ok());
        let other = check_object("/k", reg | 0o600, 1001, 1000).expect_err("other user");
        assert!(other.contains("another user's"), "{other}");
        for mode in [0o620, 0o602, 0o666] {
            let e = check_object("/k", reg | mode, 1000, 1000).expect_err("writable");
            assert!(e.contains("writable by other users"), "{e}");
        }
        let dir = check_object("/k", 0o040_000 | 0o700, 1000, 1000).expect_err("dir");
        assert!(dir.contains("not a regular file"), "{dir}");
    }

    #[test]
    fn register_checks_bounds_and_names() {
        let o = Object::new("bounds", 4096);
        let shm = SystemShm::default();
        let bad = [
            (0, 0, "greater than 0"),
            (u64::MAX, 2, "overflows"),
            (4000, 200, "fall outside"),
            (4097, 1, "fall outside"),
        ];
        for (offset, size, needle) in bad {
            let (c, m) = code(shm.register("r", &o.key, offset, size));
            assert_eq!(c, Code::InvalidArgument, "{m}");
            assert!(m.contains(needle) && m.contains("'r'"), "{m}");
        }
        shm.register("r", &o.key, 96, 4000).expect("the last bytes");
        let (c, m) = code(shm.register("r", &o.key, 0, 8));
        assert_eq!(c, Code::AlreadyExists);
        assert!(m.contains("already in manager"), "{m}");
        let (c, m) = code(shm.register("s", "/tw-sysshm-no-such-object", 0, 8));
        assert_eq!(c, Code::NotFound);
        assert!(m.contains("no shared memory object"), "{m}");
        let (c, _) = code(shm.register("s", "/a/b", 0, 8));
        assert_eq!(c, Code::InvalidArgument);
        assert_eq!(
            shm.status(None).expect("all"),
            vec![RegionStatus {
                name: "r".into(),
                key: o.key.clone(),
                offset: 96,
                byte_size: 4000
            }]
        );
        let e = shm.status(Some("s")).expect_err("unknown");
        assert_eq!(e.code(), Code::NotFound);
        shm.unregister("s"); // unknown: not an error
        shm.unregister("r");
        assert!(shm.status(None).expect("all").is_empty());
        shm.register("r", &o.key, 0, 8)
            .expect("the name is free again");
    }

    #[test]
    fn objects_others_can_write_or_reach_through_links_are_refused() {
        let o = Object::new("modes", 4096);
        let shm = SystemShm::default();
        rustix::fs::fchmod(&o.fd, Mode::from_raw_mode(0o666)).expect("chmod");
        let (c, m) = code(shm.register("r", &o.key, 0, 64));
        assert_eq!(c, Code::PermissionDenied);
        assert!(m.contains("writable by other users"), "{m}");
        rustix::fs::fchmod(&o.fd, Mode::from_raw_mode(0o600)).expect("chmod");
        let link = format!("{}-link", o.key);
        let link_path = object_path(&link).expect("key");
        let _ = std::fs::remove_file(&link_path);
        std::os::unix::fs::symlink(object_path(&o.key).expect("key"), &link_path).expect("link");
        let (c, m) = code(shm.register("r", &link, 0, 64));
        let _ = std::fs::remove_file(&link_path);
        assert_eq!(c, Code::PermissionDenied);
        assert!(m.contains("symbolic link"), "{m}");
        // Another user's object (needs root to make one).
        if rustix::process::geteuid().is_root() {
            rustix::fs::fchown(&o.fd, Some(rustix::process::Uid::from_raw(65534)), None)
                .expect("chown");
            let (c, m) = code(shm.register("r", &o.key, 0, 64));
            assert_eq!(c, Code::PermissionDenied);
            assert!(m.contains("another user's"), "{m}");
        }
        assert!(shm.status(None).expect("all").is_empty());
    }

    #[test]
    fn inputs_are_read_in_place_and_outputs_written_in_place() {
        let o = Object::new("io", 8192);
        rustix::io::pwrite(&o.fd, b"hello", 4096 + 10).expect("write");
        let shm = SystemShm::default();
        shm.register("r", &o.key, 4096, 4096).expect("register");
        let (ins, mut outs) = shm
            .lease(
                &[("input 'a'".into(), at("r", 10, 5))],
                &[("output 'b'".into(), at("r", 100, 3))],
            )
            .expect("lease");
        assert_eq!(ins[0].as_ref(), b"hello");
        outs[0].as_mut_slice().copy_from_slice(b"abc");
        assert_eq!(o.read(4096 + 100, 3), b"abc", "written into the object");
        // Writes by the client show through the mapping: no copy was made.
        rustix::io::pwrite(&o.fd, b"J", 4096 + 10).expect("write");
        assert_eq!(ins[0].as_ref(), b"Jello");
    }

    #[test]
    fn bad_tensor_ranges_are_refused() {
        let o = Object::new("ranges", 4096);
        let shm = SystemShm::default();
        shm.register("r", &o.key, 0, 1024).expect("register");
        let refuse = |ins: &[(String, ShmRef)], outs: &[(String, ShmRef)]| {
            shm.lease(ins, outs).map(|_| ()).expect_err("refused")
        };
        let e = refuse(&[("input 'a'".into(), at("nope", 0, 4))], &[]);
        assert_eq!(e.code(), Code::NotFound);
        assert!(e.message().contains("'nope'") && e.message().contains("input 'a'"));
        for (offset, size) in [(1020, 8), (1025, 0), (u64::MAX, 2)] {
            let e = refuse(&[("input 'a'".into(), at("r", offset, size))], &[]);
            assert_eq!(e.code(), Code::InvalidArgument);
            assert!(e.message().contains("fall outside"), "{}", e.message());
        }
        // An output overlapping the request's own input, or another output.
        let e = refuse(
            &[("input 'a'".into(), at("r", 0, 64))],
            &[("output 'b'".into(), at("r", 32, 64))],
        );
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().contains("overlap"), "{}", e.message());
        let e = refuse(
            &[],
            &[
                ("output 'b'".into(), at("r", 0, 64)),
                ("output 'c'".into(), at("r", 63, 1)),
            ],
        );
        assert!(
            e.message().contains("output 'b' and output 'c'"),
            "{}",
            e.message()
        );
        // Inputs may share bytes; an output right after an input is fine.
        shm.lease(
            &[
                ("input 'a'".into(), at("r", 0, 64)),
                ("input 'b'".into(), at("r", 0, 64)),
            ],
            &[("output 'c'".into(), at("r", 64, 64))],
        )
        .expect("disjoint writes");
    }

    #[test]
    fn unregister_while_in_use_unmaps_after_the_last_user() {
        let o = Object::new("inuse", 4096);
        rustix::io::pwrite(&o.fd, b"kept", 0).expect("write");
        let shm = SystemShm::default();
        shm.register("r", &o.key, 0, 4096).expect("register");
        let weak = Arc::downgrade(&shm.region("r").expect("registered"));
        let (ins, _) = shm
            .lease(&[("input 'a'".into(), at("r", 0, 4))], &[])
            .expect("lease");
        shm.unregister("r");
        let e = shm
            .lease(&[("input 'a'".into(), at("r", 0, 4))], &[])
            .map(|_| ())
            .expect_err("unregistered");
        assert_eq!(e.code(), Code::NotFound);
        assert!(weak.upgrade().is_some(), "still mapped while in use");
        assert_eq!(ins[0].as_ref(), b"kept", "and still readable");
        drop(ins);
        assert!(weak.upgrade().is_none(), "unmapped after the last user");
        // unregister_all, also while in use.
        shm.register("a", &o.key, 0, 64).expect("register");
        shm.register("b", &o.key, 64, 64).expect("register");
        let (_, outs) = shm
            .lease(&[], &[("output 'o'".into(), at("b", 0, 8))])
            .expect("lease");
        shm.unregister_all();
        assert!(shm.status(None).expect("all").is_empty());
        assert_eq!(outs[0].region(), "b");
    }

    #[test]
    fn concurrent_writers_wait_for_each_other() {
        let o = Object::new("wait", 4096);
        let shm = Arc::new(SystemShm::with_lease_wait(Duration::from_millis(200)));
        shm.register("r", &o.key, 0, 4096).expect("register");
        let out = |o: u64| [("output 'y'".to_string(), at("r", o, 64))];
        let (_, first) = shm.lease(&[], &out(0)).expect("lease");
        // Reading the bytes being written waits, and gives up at the limit.
        let e = shm
            .lease(&[("input 'x'".into(), at("r", 32, 8))], &[])
            .map(|_| ())
            .expect_err("busy");
        assert_eq!(e.code(), Code::Unavailable);
        assert!(
            e.message().contains("in use by another request"),
            "{}",
            e.message()
        );
        // Other bytes are free meanwhile.
        shm.lease(&[], &out(64)).expect("disjoint");
        // A writer waiting for the first gets the bytes once it is done.
        let t = {
            let shm = shm.clone();
            std::thread::spawn(move || shm.lease(&[], &out(0)).map(|_| ()))
        };
        std::thread::sleep(Duration::from_millis(50));
        drop(first);
        t.join()
            .expect("thread")
            .expect("got the bytes after the first");
    }

    #[test]
    fn tensor_parameters() {
        let s = |v: &str| InferParameter {
            parameter_choice: Some(ParameterChoice::StringParam(v.into())),
        };
        let i = |v: i64| InferParameter {
            parameter_choice: Some(ParameterChoice::Int64Param(v)),
        };
        let params = |kv: Vec<(&str, InferParameter)>| -> HashMap<String, InferParameter> {
            kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
        };
        assert_eq!(shm_ref("input", "x", &HashMap::new()).expect("none"), None);
        assert_eq!(
            shm_ref(
                "input",
                "x",
                &params(vec![(PARAM_REGION, s("r")), (PARAM_BYTE_SIZE, i(16))])
            )
            .expect("ok"),
            Some(at("r", 0, 16))
        );
        assert_eq!(
            shm_ref(
                "input",
                "x",
                &params(vec![
                    (PARAM_REGION, s("r")),
                    (PARAM_BYTE_SIZE, i(16)),
                    (PARAM_OFFSET, i(64))
                ])
            )
            .expect("ok"),
            Some(at("r", 64, 16))
        );
        let bad = [
            (vec![(PARAM_REGION, s("r"))], "must be given"),
            (vec![(PARAM_BYTE_SIZE, i(4))], "need"),
            (vec![(PARAM_OFFSET, i(4))], "need"),
            (
                vec![(PARAM_REGION, i(1)), (PARAM_BYTE_SIZE, i(4))],
                "must be a string",
            ),
            (
                vec![(PARAM_REGION, s("r")), (PARAM_BYTE_SIZE, i(-4))],
                "non-negative",
            ),
            (
                vec![
                    (PARAM_REGION, s("r")),
                    (PARAM_BYTE_SIZE, i(4)),
                    (PARAM_OFFSET, s("0")),
                ],
                "non-negative",
            ),
        ];
        for (kv, needle) in bad {
            let e = shm_ref("input", "x", &params(kv)).expect_err("refused");
            assert_eq!(e.code(), Code::InvalidArgument);
            assert!(
                e.message().contains(needle) && e.message().contains("input 'x'"),
                "{}",
                e.message()
            );
        }
    }
}
