//! Autocast's state and casts (the tensor layer's half of `ember::amp`; the
//! loss scaler is `optim::GradScaler`, above the optimizers it steps): the
//! public face and its documentation are `ember::amp`.

use crate::{
    device::Device,
    dtype::DType,
    error::{Error, Result},
    tensor::Tensor,
};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;

/// The device types autocast is set for separately (`torch.autocast`'s
/// `device_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceType {
    /// CPU tensors.
    Cpu,
    /// CUDA tensors (and `meta` tensors, which stand for them).
    Cuda,
}

impl DeviceType {
    const ALL: [DeviceType; 2] = [DeviceType::Cpu, DeviceType::Cuda];

    fn of(device: &Device) -> DeviceType {
        match device {
            Device::Cpu => DeviceType::Cpu,
            _ => DeviceType::Cuda,
        }
    }

    fn slot(self) -> usize {
        self as usize
    }

    fn name(self) -> &'static str {
        match self {
            DeviceType::Cpu => "CPU",
            DeviceType::Cuda => "CUDA",
        }
    }
}

thread_local! {
    /// The lower-precision dtype per device type, None where autocast is off.
    static STATE: Cell<[Option<DType>; 2]> = const { Cell::new([None, None]) };
    /// How many autocast regions are open (the cache empties when the last closes).
    static DEPTH: Cell<usize> = const { Cell::new(0) };
    /// Casts of parameters made in the open regions, by (tensor, dtype), with the
    /// parameter itself: held, its address cannot be reused by another tensor
    /// while the entry lives.
    static CACHE: RefCell<HashMap<(usize, DType), (Tensor, Tensor)>> = RefCell::new(HashMap::new());
    /// The open guards' changes, oldest first: a guard dropped out of order
    /// (two guards in a struct drop first field first) takes out its own
    /// change and leaves the others' in force.
    static OPEN: RefCell<Vec<Change>> = const { RefCell::new(Vec::new()) };
    static NEXT_GUARD: Cell<u64> = const { Cell::new(0) };
}

/// One open guard's change to the state: `dtype` for one device type's slot,
/// or for both (`slot` None); `previous` is the state under it.
#[derive(Clone, Copy)]
struct Change {
    id: u64,
    slot: Option<usize>,
    dtype: Option<DType>,
    previous: [Option<DType>; 2],
}

impl Change {
    fn apply(&self, mut state: [Option<DType>; 2]) -> [Option<DType>; 2] {
        match self.slot {
            Some(i) => state[i] = self.dtype,
            None => state = [self.dtype; 2],
        }
        state
    }
}

/// Opens a change (a guard's), in force until [`close`] with the id returned.
fn open(slot: Option<usize>, dtype: Option<DType>) -> u64 {
    let id = NEXT_GUARD.with(|n| {
        let id = n.get();
        n.set(id + 1);
        id
    });
    let previous = STATE.with(|s| s.get());
    let change = Change {
        id,
        slot,
        dtype,
        previous,
    };
    STATE.with(|s| s.set(change.apply(previous)));
    OPEN.with(|o| o.borrow_mut().push(change));
    id
}

/// Closes change `id`: the state is what the changes still open make of the
/// state from before the oldest (the one under `id` when it was the newest).
fn close(id: u64) {
    OPEN.with(|o| {
        let mut o = o.borrow_mut();
        let Some(i) = o.iter().position(|c| c.id == id) else {
            return;
        };
        let gone = o.remove(i);
        let mut state = if i == 0 { gone.previous } else { o[0].previous };
        for c in o.iter_mut() {
            c.previous = state;
            state = c.apply(state);
        }
        STATE.with(|s| s.set(state));
    });
}

/// Restores the autocast state from before it was made when dropped; the
/// outermost one also empties the cast cache. Guards dropped in another order
/// than they were made (two in a struct, whose fields drop first field first)
/// each take out their own setting only. The state is this thread's: the
/// guard cannot move to another thread.
///
/// ```compile_fail
/// fn elsewhere<T: Send + 'static>(t: T) {
///     std::thread::spawn(move || drop(t));
/// }
/// elsewhere(ember::amp::autocast_guard(ember::DType::BF16).unwrap());
/// ```
#[must_use = "autocast is on only while the guard lives"]
pub struct AutocastGuard {
    id: u64,
    _this_thread: std::marker::PhantomData<*const ()>,
}

impl Drop for AutocastGuard {
    fn drop(&mut self) {
        close(self.id);
        let depth = DEPTH.with(|d| {
            let n = d.get().saturating_sub(1);
            d.set(n);
            n
        });
        if depth == 0 {
            CACHE.with(|c| c.borrow_mut().clear());
        }
    }
}

fn check_dtype(device_type: DeviceType, dtype: DType) -> Result<()> {
    if matches!(dtype, DType::BF16 | DType::F16) {
        return Ok(());
    }
    Err(Error::dtype(
        "autocast",
        dtype,
        format!(
            "In {} autocast, the target dtype is not supported: {} autocast only supports \
             bfloat16 and float16",
            device_type.name(),
            device_type.name()
        ),
    ))
}

/// Turns autocast to `dtype` (bfloat16 or float16) on for `device_type`, or off
/// with `None` (`torch.autocast(device_type, dtype, enabled)`), on this thread
/// until the guard drops. Other device types keep their setting.
pub fn autocast_guard_for(device_type: DeviceType, dtype: Option<DType>) -> Result<AutocastGuard> {
    if let Some(dt) = dtype {
        check_dtype(device_type, dt)?;
    }
    let id = open(Some(device_type.slot()), dtype);
    DEPTH.with(|d| d.set(d.get() + 1));
    Ok(AutocastGuard {
        id,
        _this_thread: std::marker::PhantomData,
    })
}

/// Turns autocast to `dtype` (bfloat16 or float16) on for every device type on
/// this thread until the guard drops.
pub fn autocast_guard(dtype: DType) -> Result<AutocastGuard> {
    for t in DeviceType::ALL {
        check_dtype(t, dtype)?;
    }
    let id = open(None, Some(dtype));
    DEPTH.with(|d| d.set(d.get() + 1));
    Ok(AutocastGuard {
        id,
        _this_thread: std::marker::PhantomData,
    })
}

/// Runs `f` with autocast to `dtype` (bfloat16 or float16) on for every device
/// type: `with torch.autocast(device_type, dtype):`. An integer or float32/64
/// `dtype` is an error (PyTorch warns and leaves autocast off).
pub fn autocast<R>(dtype: DType, f: impl FnOnce() -> R) -> Result<R> {
    let _g = autocast_guard(dtype)?;
    Ok(f())
}

/// The lower-precision dtype autocast uses on `device_type` on this thread, or
/// None where it is off (`torch.get_autocast_dtype` with
/// `torch.is_autocast_enabled`).
pub fn autocast_dtype(device_type: DeviceType) -> Option<DType> {
    STATE.with(|s| s.get()[device_type.slot()])
}

/// Runs `f` with autocast off on every device type (for ops that choose their own
/// precision inside, such as the memory-saving attention's recomputation); the
/// region's cast cache is kept.
pub(crate) fn without<R>(f: impl FnOnce() -> R) -> R {
    if all_off() {
        return f();
    }
    struct Restore(u64);
    impl Drop for Restore {
        fn drop(&mut self) {
            close(self.0);
        }
    }
    let _restore = Restore(open(None, None));
    f()
}

/// Whether autocast is on for `device_type` on this thread.
pub fn is_autocast_enabled(device_type: DeviceType) -> bool {
    autocast_dtype(device_type).is_some()
}

/// Whether autocast is off on every device type (the usual case: the ops' hooks
/// return at once, without looking at their inputs).
fn all_off() -> bool {
    STATE.with(|s| s.get()) == [None, None]
}

/// Whether autocast casts `t` (an enabled device type, and float32, float16 or
/// bfloat16: float64 is never cast), and to what, for a lower-precision op.
fn lower_dtype(t: &Tensor) -> Option<DType> {
    let dt = autocast_dtype(DeviceType::of(&t.device()))?;
    matches!(t.dtype(), DType::F32 | DType::F16 | DType::BF16).then_some(dt)
}

/// `t` in `dtype`, through the cache for parameters. Only casts made with
/// gradients on are cached: one made under `no_grad` has no history, and a
/// later forward in the region that trains must not reuse it (its parameter
/// would get no gradient); under `no_grad` a cached cast serves as it is.
fn cast(t: &Tensor, dtype: DType) -> Result<Tensor> {
    if !(t.is_leaf() && t.requires_grad()) {
        return t.to_dtype(dtype);
    }
    let key = (t.id(), dtype);
    if let Some((_, c)) = CACHE.with(|c| c.borrow().get(&key).cloned()) {
        return Ok(c);
    }
    let c = t.to_dtype(dtype)?;
    if crate::autograd::is_grad_enabled() {
        CACHE.with(|m| m.borrow_mut().insert(key, (t.clone(), c.clone())));
    }
    Ok(c)
}

/// For an op that autocast runs in the lower precision: `ts` cast to it where
/// autocast casts them, or None when it changes none of them (autocast off, or
/// already cast: the op then runs as it is).
pub(crate) fn lower(ts: &[&Tensor]) -> Result<Option<Vec<Tensor>>> {
    if all_off() {
        return Ok(None);
    }
    let want: Vec<Option<DType>> = ts.iter().map(|t| lower_dtype(t)).collect();
    if ts
        .iter()
        .zip(&want)
        .all(|(t, w)| w.is_none_or(|dt| dt == t.dtype()))
    {
        return Ok(None);
    }
    ts.iter()
        .zip(want)
        .map(|(t, w)| match w {
            Some(dt) => cast(t, dt),
            None => Ok((*t).clone()),
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// Whether [`lower`] would cast any of `ts` (without casting).
pub(crate) fn would_lower(ts: &[&Tensor]) -> bool {
    ts.iter()
        .any(|t| lower_dtype(t).is_some_and(|dt| dt != t.dtype()))
}

/// One tensor for the lower precision (a module's own parameter that its op
/// does not pass through [`lower`], such as `Linear`'s bias).
pub(crate) fn lower_one(t: &Tensor) -> Result<Tensor> {
    match lower_dtype(t) {
        Some(dt) if dt != t.dtype() => cast(t, dt),
        _ => Ok(t.clone()),
    }
}

/// For an op that autocast runs in float32 on `which` device types: `ts` with
/// float16 and bfloat16 tensors cast to float32, or None when none needs it.
fn to_f32_on(ts: &[&Tensor], which: &[DeviceType]) -> Result<Option<Vec<Tensor>>> {
    if all_off() {
        return Ok(None);
    }
    let casts = |t: &Tensor| {
        let ty = DeviceType::of(&t.device());
        which.contains(&ty)
            && is_autocast_enabled(ty)
            && matches!(t.dtype(), DType::F16 | DType::BF16)
    };
    if !ts.iter().any(|t| casts(t)) {
        return Ok(None);
    }
    ts.iter()
        .map(|t| {
            if casts(t) {
                t.to_dtype(DType::F32)
            } else {
                Ok((*t).clone())
            }
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// The ops of PyTorch's CUDA autocast float32 lists that reach ember's shared
/// unary and reduction entry points, by the names ember's ops give themselves
/// (PyTorch's `reciprocal` is ember's `recip`): PyTorch runs them in float32
/// on CUDA, and leaves them in the input's dtype on the CPU. The list's other ops (softmax, layer_norm,
/// the scans, logsumexp, the norms, pow, cosine_similarity) call
/// [`to_f32_cuda`] themselves.
const CUDA_F32_OPS: &[&str] = &[
    "exp", "expm1", "log", "log2", "log10", "log1p", "recip", "rsqrt", "tan", "softplus", "sum",
    "acos", "asin", "cosh", "sinh", "erfinv",
];

/// Whether PyTorch's CUDA autocast runs the op named `name` in float32.
pub(crate) fn cuda_runs_in_f32(name: &str) -> bool {
    is_autocast_enabled(DeviceType::Cuda) && CUDA_F32_OPS.contains(&name)
}

/// Whether [`to_f32`] would cast any of `ts` (without casting).
pub(crate) fn would_f32(ts: &[&Tensor]) -> bool {
    !all_off()
        && ts.iter().any(|t| {
            is_autocast_enabled(DeviceType::of(&t.device()))
                && matches!(t.dtype(), DType::F16 | DType::BF16)
        })
}

/// For an op on both device types' float32 lists (the losses).
pub(crate) fn to_f32(ts: &[&Tensor]) -> Result<Option<Vec<Tensor>>> {
    to_f32_on(ts, &DeviceType::ALL)
}

/// For an op on the CPU's float32 list only (reflection and replication
/// padding).
pub(crate) fn to_f32_cpu(ts: &[&Tensor]) -> Result<Option<Vec<Tensor>>> {
    to_f32_on(ts, &[DeviceType::Cpu])
}

/// For an op on CUDA's float32 list only (softmax, log_softmax, layer_norm).
pub(crate) fn to_f32_cuda(ts: &[&Tensor]) -> Result<Option<Vec<Tensor>>> {
    to_f32_on(ts, &[DeviceType::Cuda])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guards_nest_and_restore() {
        assert_eq!(autocast_dtype(DeviceType::Cpu), None);
        {
            let _a = autocast_guard(DType::BF16).unwrap();
            assert_eq!(autocast_dtype(DeviceType::Cuda), Some(DType::BF16));
            {
                let _b = autocast_guard_for(DeviceType::Cuda, None).unwrap();
                assert!(!is_autocast_enabled(DeviceType::Cuda));
                assert!(is_autocast_enabled(DeviceType::Cpu));
            }
            assert_eq!(autocast_dtype(DeviceType::Cuda), Some(DType::BF16));
        }
        assert_eq!(autocast_dtype(DeviceType::Cpu), None);
        assert_eq!(DEPTH.with(|d| d.get()), 0);
        // dropped out of order (a struct's fields drop first field first):
        // each takes out its own setting, and the last leaves autocast off
        let outer = autocast_guard(DType::BF16).unwrap();
        let inner = autocast_guard_for(DeviceType::Cpu, None).unwrap();
        let cuda = autocast_guard_for(DeviceType::Cuda, Some(DType::F16)).unwrap();
        drop(outer);
        assert_eq!(autocast_dtype(DeviceType::Cpu), None);
        assert_eq!(autocast_dtype(DeviceType::Cuda), Some(DType::F16));
        drop(cuda);
        assert_eq!(autocast_dtype(DeviceType::Cuda), None);
        drop(inner);
        assert!(all_off());
        assert_eq!(DEPTH.with(|d| d.get()), 0);
        assert!(OPEN.with(|o| o.borrow().is_empty()));
    }

    #[test]
    fn parameters_are_cast_once_per_region() -> Result<()> {
        let p = Tensor::new(vec![1f32, 2.], &Device::Cpu)?.requires_grad_(true)?;
        let h = p.mul(&p)?; // not a leaf: cast at each use
        let casts = |dt| -> Result<[Tensor; 4]> {
            let _g = autocast_guard(dt)?;
            let (a, b) = (lower_one(&p)?, lower_one(&p)?);
            let (c, d) = (lower_one(&h)?, lower_one(&h)?);
            assert_eq!(a.dtype(), dt);
            Ok([a, b, c, d])
        };
        // the tensors are kept alive, so that their ids cannot be reused
        let [a, b, c, d] = casts(DType::BF16)?;
        assert_eq!(a.id(), b.id(), "a parameter is cast once");
        assert_ne!(c.id(), d.id(), "other tensors are cast each time");
        assert!(
            CACHE.with(|m| m.borrow().is_empty()),
            "emptied when the region ends"
        );
        let [a2, ..] = casts(DType::BF16)?;
        assert_ne!(a.id(), a2.id(), "a new region casts again");
        // float64 is never cast
        let f = Tensor::new(vec![1f64], &Device::Cpu)?;
        let _g = autocast_guard(DType::F16)?;
        assert_eq!(lower_one(&f)?.dtype(), DType::F64);
        assert!(lower(&[&f])?.is_none());
        Ok(())
    }

    #[test]
    fn integer_and_wide_dtypes_are_refused() {
        for dt in [DType::I64, DType::U8, DType::F32, DType::F64, DType::Bool] {
            let e = autocast(dt, || ()).unwrap_err().to_string();
            assert!(e.contains("only supports bfloat16 and float16"), "{e}");
        }
        assert_eq!(autocast_dtype(DeviceType::Cpu), None);
    }
}
