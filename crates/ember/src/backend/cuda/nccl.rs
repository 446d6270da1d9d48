//! NCCL (`libnccl.so.2`), loaded at run time from where ember finds the other CUDA
//! libraries (pip's `nvidia-nccl-cu13` included): the collectives of the
//! distributed NCCL backend, queued on a CUDA stream like any kernel.
//!
//! The entry points are bound here with `libloading` rather than through cudarc's
//! NCCL module, whose loader asks for `libnccl.so` and `libnccl.so.<CUDA major>`
//! but not NCCL's own `libnccl.so.2`, the only name pip's wheel ships.

use super::libs::{self, CudaLib, LibSource};
use crate::backend::op::collective::{Collective, CommKind, ReduceOp};
use crate::{
    dtype::DType,
    error::{Error, Result},
};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

/// `ncclUniqueId`: what rank 0 makes and every rank passes to `ncclCommInitRank`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct UniqueId {
    pub(crate) internal: [c_char; 128],
}

type Comm = *mut c_void;
type Res = c_int;

/// The NCCL entry points ember calls.
pub(crate) struct Nccl {
    _lib: libloading::Library,
    get_version: unsafe extern "C" fn(*mut c_int) -> Res,
    get_unique_id: unsafe extern "C" fn(*mut UniqueId) -> Res,
    comm_init_rank: unsafe extern "C" fn(*mut Comm, c_int, UniqueId, c_int) -> Res,
    comm_destroy: unsafe extern "C" fn(Comm) -> Res,
    comm_abort: unsafe extern "C" fn(Comm) -> Res,
    get_error_string: unsafe extern "C" fn(Res) -> *const c_char,
    comm_get_async_error: unsafe extern "C" fn(Comm, *mut Res) -> Res,
    all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        Comm,
        *mut c_void,
    ) -> Res,
    broadcast: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        Comm,
        *mut c_void,
    ) -> Res,
    all_gather:
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, Comm, *mut c_void) -> Res,
    reduce_scatter: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        Comm,
        *mut c_void,
    ) -> Res,
}

// SAFETY: the struct holds function pointers into a library that stays loaded,
// and NCCL's entry points may be called from any thread.
unsafe impl Send for Nccl {}
unsafe impl Sync for Nccl {}

/// The loaded library, or why it could not be loaded.
pub(crate) fn library() -> &'static std::result::Result<Nccl, String> {
    static LIB: OnceLock<std::result::Result<Nccl, String>> = OnceLock::new();
    LIB.get_or_init(load)
}

fn load() -> std::result::Result<Nccl, String> {
    let source = libs::ensure(CudaLib::Nccl)?;
    let path = match &source {
        LibSource::Path(p) => p.as_os_str().to_owned(),
        LibSource::LoaderPath(name) => name.into(),
    };
    // SAFETY: loading NCCL runs its initialisers, which set up only NCCL itself
    let lib = unsafe { libloading::Library::new(&path) }.map_err(|e| format!("{source}: {e}"))?;
    macro_rules! sym {
        ($name:literal) => {
            // SAFETY: the symbol is NCCL's function of that name, whose C
            // signature the field's type spells out (nccl.h, NCCL 2.x)
            *unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                .map_err(|e| format!("{source}: {} is missing: {e}", $name))?
        };
    }
    Ok(Nccl {
        get_version: sym!("ncclGetVersion"),
        get_unique_id: sym!("ncclGetUniqueId"),
        comm_init_rank: sym!("ncclCommInitRank"),
        comm_destroy: sym!("ncclCommDestroy"),
        comm_abort: sym!("ncclCommAbort"),
        get_error_string: sym!("ncclGetErrorString"),
        comm_get_async_error: sym!("ncclCommGetAsyncError"),
        all_reduce: sym!("ncclAllReduce"),
        broadcast: sym!("ncclBroadcast"),
        all_gather: sym!("ncclAllGather"),
        reduce_scatter: sym!("ncclReduceScatter"),
        _lib: lib,
    })
}

/// `ncclDataType_t` of `dtype` and the reduction for it: bool travels as bytes,
/// where sum and max are `or`, product and min are `and`.
fn nccl_type(dtype: DType, op: Option<ReduceOp>) -> (c_int, c_int) {
    let code = |op: ReduceOp| match op {
        ReduceOp::Sum => 0,
        ReduceOp::Product => 1,
        ReduceOp::Max => 2,
        ReduceOp::Min => 3,
        ReduceOp::Avg => 4,
    };
    let op = op.unwrap_or(ReduceOp::Sum);
    match dtype {
        DType::Bool => (
            1,
            match op {
                ReduceOp::Sum | ReduceOp::Avg | ReduceOp::Max => 2,
                ReduceOp::Product | ReduceOp::Min => 3,
            },
        ),
        DType::U8 => (1, code(op)),
        DType::I64 => (4, code(op)),
        DType::F16 => (6, code(op)),
        DType::F32 => (7, code(op)),
        DType::F64 => (8, code(op)),
        DType::BF16 => (9, code(op)),
    }
}

impl Nccl {
    fn check(&self, what: &'static str, r: Res) -> Result<()> {
        if r == 0 {
            return Ok(());
        }
        // SAFETY: NCCL returns a static string for every result code
        let msg = unsafe { CStr::from_ptr((self.get_error_string)(r)) };
        Err(Error::Cuda {
            op: what,
            msg: format!("NCCL error {r}: {}", msg.to_string_lossy()),
        })
    }

    /// NCCL's version as `(major, minor, patch)`.
    pub(crate) fn version(&self) -> Result<(u32, u32, u32)> {
        let mut v: c_int = 0;
        // SAFETY: writes one int
        self.check("ncclGetVersion", unsafe { (self.get_version)(&mut v) })?;
        let v = v as u32;
        // NCCL_VERSION_CODE: major * 10000 + minor * 100 + patch since 2.9,
        // major * 1000 + minor * 100 + patch before
        Ok(if v >= 10000 {
            (v / 10000, (v / 100) % 100, v % 100)
        } else {
            (v / 1000, (v / 100) % 10, v % 100)
        })
    }

    /// A new communicator's id (rank 0's, shared with the others).
    pub(crate) fn unique_id(&self) -> Result<UniqueId> {
        let mut id = UniqueId { internal: [0; 128] };
        // SAFETY: writes the 128-byte id
        self.check("ncclGetUniqueId", unsafe { (self.get_unique_id)(&mut id) })?;
        Ok(id)
    }

    /// Joins the communicator `id` as `rank` of `world` on the current device
    /// (the caller binds its context first). Blocks until every rank has joined.
    pub(crate) fn init_rank(&self, id: UniqueId, world: usize, rank: usize) -> Result<usize> {
        let mut comm: Comm = std::ptr::null_mut();
        // SAFETY: `comm` receives the new communicator
        self.check("ncclCommInitRank", unsafe {
            (self.comm_init_rank)(&mut comm, world as c_int, id, rank as c_int)
        })?;
        Ok(comm as usize)
    }

    /// The communicator's asynchronous error, if its calls have failed.
    pub(crate) fn async_error(&self, comm: usize) -> Result<()> {
        let mut r: Res = 0;
        // SAFETY: `comm` came from `init_rank`; writes one int
        self.check("ncclCommGetAsyncError", unsafe {
            (self.comm_get_async_error)(comm as Comm, &mut r)
        })?;
        // ncclInProgress (7) is not a failure
        if r == 7 {
            return Ok(());
        }
        self.check("an NCCL call queued before", r)
    }

    /// Frees a communicator; `abort` stops its operations in flight first.
    pub(crate) fn destroy(&self, comm: usize, abort: bool) {
        let c = comm as Comm;
        // SAFETY: `comm` came from `init_rank` and is not used after this
        unsafe {
            if abort {
                (self.comm_abort)(c);
            } else {
                (self.comm_destroy)(c);
            }
        }
    }

    /// Queues `c` on `stream`.
    ///
    /// # Safety
    /// `c`'s pointers address device memory of the communicator's device that is
    /// large enough for the call and stays alive until the stream has run it.
    pub(crate) unsafe fn run(
        &self,
        comm: usize,
        stream: *mut c_void,
        c: &Collective,
    ) -> Result<()> {
        let comm = comm as Comm;
        let (src, dst) = (c.src as *const c_void, c.dst as *mut c_void);
        let r = match c.kind {
            CommKind::AllReduce(op) => {
                let (t, o) = nccl_type(c.dtype, Some(op));
                (self.all_reduce)(src, dst, c.count, t, o, comm, stream)
            }
            CommKind::Broadcast(root) => {
                let (t, _) = nccl_type(c.dtype, None);
                (self.broadcast)(src, dst, c.count, t, root as c_int, comm, stream)
            }
            CommKind::AllGather => {
                let (t, _) = nccl_type(c.dtype, None);
                (self.all_gather)(src, dst, c.count, t, comm, stream)
            }
            CommKind::ReduceScatter(op) => {
                let (t, o) = nccl_type(c.dtype, Some(op));
                (self.reduce_scatter)(src, dst, c.count, t, o, comm, stream)
            }
        };
        self.check(c.kind.name(), r)
    }
}

#[cfg(test)]
mod tests {
    /// With NCCL where ember looks (CI installs pip's `nvidia-nccl-cu13`), every
    /// entry point ember binds resolves, and the calls that need no GPU answer.
    #[test]
    fn nccl_loads_with_every_entry_point() {
        let lib = match super::library() {
            Ok(lib) => lib,
            Err(why) => {
                println!("skipped: NCCL is not installed here ({why})");
                return;
            }
        };
        let (major, minor, _) = lib.version().unwrap();
        assert_eq!(major, 2, "NCCL {major}.{minor}");
        assert!(
            minor >= 10,
            "ncclAvg needs NCCL 2.10 or later, found 2.{minor}"
        );
        match lib.unique_id() {
            Ok(id) => assert!(id.internal.iter().any(|b| *b != 0)),
            // NCCL may need a GPU for its bootstrap on some machines
            Err(e) => println!("ncclGetUniqueId without a GPU: {e}"),
        }
    }
}
