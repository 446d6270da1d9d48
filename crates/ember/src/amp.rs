//! Automatic mixed precision: `torch.autocast`.
//!
//! Inside [`autocast`] (or while an [`AutocastGuard`] lives) on this thread, the
//! ops PyTorch's autocast lists run in a chosen lower precision or in float32,
//! whatever the dtype of their floating-point inputs:
//!
//! - **in the lower precision** (bfloat16 or float16): `matmul` (and `bmm`,
//!   `einsum`'s products, `Linear`, which go through it), `conv2d` and
//!   `scaled_dot_product_attention`, and so `MultiheadAttention` and the
//!   transformer layers' products;
//! - **in float32**: the losses (`cross_entropy`, `nll_loss`, `mse_loss`,
//!   `bce_with_logits`), and on CUDA also `softmax`, `log_softmax` and
//!   `layer_norm`, as PyTorch's CUDA list has them (its CPU list leaves them in
//!   the input's dtype, and so does ember's CPU);
//! - everything else runs in its inputs' dtype, with the usual promotion when
//!   they differ (a bfloat16 product plus a float32 bias is float32).
//!
//! Only float32, float16 and bfloat16 inputs are cast (float64 is left alone, as
//! in PyTorch); the casts are ordinary differentiable ops, so gradients flow back
//! to float32 parameters (the master weights) in float32. A parameter (a leaf
//! that requires grad) is cast once per outermost autocast region and the cast
//! reused, as PyTorch's cast cache does.
//!
//! Autocast is per device type: CPU tensors follow the CPU's setting; CUDA
//! tensors, and `meta` tensors (which stand for a GPU's in `ember estimate`),
//! follow CUDA's.

use crate::{DType, Device, Error, Result, Tensor};
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
}

/// Restores the autocast state from before it was made when dropped; the
/// outermost one also empties the cast cache.
#[must_use = "autocast is on only while the guard lives"]
pub struct AutocastGuard {
    previous: [Option<DType>; 2],
}

impl Drop for AutocastGuard {
    fn drop(&mut self) {
        STATE.with(|s| s.set(self.previous));
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
    let previous = STATE.with(|s| {
        let prev = s.get();
        let mut now = prev;
        now[device_type.slot()] = dtype;
        s.set(now);
        prev
    });
    DEPTH.with(|d| d.set(d.get() + 1));
    Ok(AutocastGuard { previous })
}

/// Turns autocast to `dtype` (bfloat16 or float16) on for every device type on
/// this thread until the guard drops.
pub fn autocast_guard(dtype: DType) -> Result<AutocastGuard> {
    for t in DeviceType::ALL {
        check_dtype(t, dtype)?;
    }
    let previous = STATE.with(|s| s.replace([Some(dtype), Some(dtype)]));
    DEPTH.with(|d| d.set(d.get() + 1));
    Ok(AutocastGuard { previous })
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
    struct Restore([Option<DType>; 2]);
    impl Drop for Restore {
        fn drop(&mut self) {
            STATE.with(|s| s.set(self.0));
        }
    }
    let _restore = Restore(STATE.with(|s| s.replace([None, None])));
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

/// `t` in `dtype`, through the cache for parameters.
fn cast(t: &Tensor, dtype: DType) -> Result<Tensor> {
    if !(t.is_leaf() && t.requires_grad()) {
        return t.to_dtype(dtype);
    }
    let key = (t.id(), dtype);
    if let Some((_, c)) = CACHE.with(|c| c.borrow().get(&key).cloned()) {
        return Ok(c);
    }
    let c = t.to_dtype(dtype)?;
    CACHE.with(|m| m.borrow_mut().insert(key, (t.clone(), c.clone())));
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
/// unary and reduction entry points, by the names ember's ops give themselves:
/// PyTorch runs them in float32 on CUDA, and leaves them in the input's dtype on the
/// CPU. The list's other ops (softmax, layer_norm, the scans, logsumexp, the norms,
/// pow) call [`to_f32_cuda`] themselves.
const CUDA_F32_OPS: &[&str] = &[
    "exp",
    "expm1",
    "log",
    "log2",
    "log10",
    "log1p",
    "reciprocal",
    "rsqrt",
    "tan",
    "sinh",
    "cosh",
    "asin",
    "acos",
    "softplus",
    "sum",
];

/// Whether PyTorch's CUDA autocast runs the op named `name` in float32.
pub(crate) fn cuda_runs_in_f32(name: &str) -> bool {
    is_autocast_enabled(DeviceType::Cuda) && CUDA_F32_OPS.contains(&name)
}

/// For an op on both device types' float32 lists (the losses).
pub(crate) fn to_f32(ts: &[&Tensor]) -> Result<Option<Vec<Tensor>>> {
    to_f32_on(ts, &DeviceType::ALL)
}

/// For an op on CUDA's float32 list only (softmax, log_softmax, layer_norm).
pub(crate) fn to_f32_cuda(ts: &[&Tensor]) -> Result<Option<Vec<Tensor>>> {
    to_f32_on(ts, &[DeviceType::Cuda])
}

/// Where a [`GradScaler`] is in its step with one optimizer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Ready,
    Unscaled,
    Stepped,
}

/// A [`GradScaler`]'s record of one optimizer between two updates (PyTorch's
/// per-optimizer state): its stage, the count of gradients holding an infinity
/// or NaN (on the device), and that count's verdict once `step` has read it.
#[derive(Clone, Debug)]
struct OptimizerState {
    /// The optimizer's address: the optimizer this record belongs to while it
    /// lives (records last until the next update).
    key: usize,
    stage: Stage,
    found_inf: Option<Tensor>,
    found: Option<bool>,
}

/// Identifies an optimizer by its address, as PyTorch's `id(optimizer)`.
fn optimizer_key(o: &dyn crate::optim::Optimizer) -> usize {
    o as *const dyn crate::optim::Optimizer as *const () as usize
}

/// Dynamic loss scaling for float16 training (`torch.amp.GradScaler`): the loss
/// is multiplied by a large scale before `backward` so that small float16
/// gradients do not flush to zero; [`step`](Self::step) divides the gradients by
/// it again, skips the optimizer's step when any gradient is infinite or NaN, and
/// [`update`](Self::update) then lowers the scale (`backoff_factor`), or raises it
/// (`growth_factor`) after `growth_interval` steps in a row without one.
///
/// ```
/// # use ember::{prelude::*, amp::GradScaler, optim::Sgd};
/// let w = Tensor::new(&[1f32, -2.], &Device::Cpu)?.requires_grad_(true)?;
/// let mut opt = Sgd::new(vec![w.clone()], 0.1)?;
/// let mut scaler = GradScaler::new();
/// let loss = w.square()?.sum_all()?;
/// scaler.scale(&loss)?.backward()?; // gradients times 65536
/// scaler.step(&mut opt)?; // unscaled, checked, stepped
/// scaler.update()?;
/// assert_eq!(w.to_vec1::<f32>()?, vec![0.8, -1.6]);
/// # Ok::<(), ember::Error>(())
/// ```
///
/// The check for infinities runs on the device and adds one flag per step;
/// `step` reads that flag, the one host wait of the step (as PyTorch's does;
/// `update` reuses what `step` read). One scaler can serve several optimizers, as
/// PyTorch's: each is unscaled and stepped once (in any order), then one `update`
/// lowers the scale if any of them found an infinity or NaN.
/// With `enabled(false)` (bfloat16 or float32 training, which need no scaling)
/// every method passes through: `scale` returns the loss, `step` steps.
#[derive(Clone, Debug)]
pub struct GradScaler {
    enabled: bool,
    scale: f64,
    growth_factor: f64,
    backoff_factor: f64,
    growth_interval: u64,
    growth_tracker: u64,
    /// The optimizers unscaled or stepped since the last update.
    optimizers: Vec<OptimizerState>,
}

impl Default for GradScaler {
    fn default() -> Self {
        GradScaler::new()
    }
}

impl GradScaler {
    /// PyTorch's defaults: scale 65536 (2^16), growth factor 2, backoff factor
    /// 0.5, growth interval 2000.
    pub fn new() -> GradScaler {
        GradScaler {
            enabled: true,
            scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
            growth_tracker: 0,
            optimizers: Vec::new(),
        }
    }

    /// A scaler with these settings; PyTorch's errors for a growth factor not
    /// above 1, a backoff factor not below 1, or a scale or interval that is not
    /// positive.
    pub fn with_options(
        init_scale: f64,
        growth_factor: f64,
        backoff_factor: f64,
        growth_interval: u64,
    ) -> Result<GradScaler> {
        let bad = |m: &str| Err(Error::invalid("GradScaler", m.to_string()));
        if growth_factor.is_nan() || growth_factor <= 1.0 {
            return bad("The growth factor must be > 1.0.");
        }
        if backoff_factor.is_nan() || backoff_factor >= 1.0 {
            return bad("The backoff factor must be < 1.0.");
        }
        if !(init_scale.is_finite() && init_scale > 0.0) {
            return bad("the initial scale must be a positive finite number");
        }
        if growth_interval == 0 {
            return bad("the growth interval must be positive");
        }
        Ok(GradScaler {
            scale: init_scale,
            growth_factor,
            backoff_factor,
            growth_interval,
            ..GradScaler::new()
        })
    }

    /// Whether scaling is on (`enabled=False` in PyTorch makes every method pass
    /// through).
    pub fn enabled(mut self, on: bool) -> GradScaler {
        self.enabled = on;
        self
    }

    /// Whether scaling is on.
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// The current scale (`get_scale()`; 1 when disabled).
    pub fn get_scale(&self) -> f64 {
        if self.enabled {
            self.scale
        } else {
            1.0
        }
    }

    /// The loss times the scale (float32 scale; a float16 loss becomes float32,
    /// as in PyTorch, where the scale is a float32 tensor).
    pub fn scale(&self, loss: &Tensor) -> Result<Tensor> {
        if !self.enabled {
            return Ok(loss.clone());
        }
        let s = Tensor::full((), self.scale, DType::F32, &loss.device())?;
        loss.mul(&s)
    }

    /// Divides the optimizer's gradients by the scale in place and notes on the
    /// device whether any holds an infinity or NaN (before gradient clipping, say).
    /// At most once between two [`update`](Self::update)s, and before
    /// [`step`](Self::step), which calls it when the user has not.
    pub fn unscale_(&mut self, optimizer: &dyn crate::optim::Optimizer) -> Result<()> {
        if !self.enabled {
            return Ok(());
        }
        let i = self.state_of(optimizer);
        match self.optimizers[i].stage {
            Stage::Unscaled => {
                return Err(Error::invalid(
                    "GradScaler::unscale_",
                    "unscale_() has already been called on this optimizer since the last update().",
                ))
            }
            Stage::Stepped => {
                return Err(Error::invalid(
                    "GradScaler::unscale_",
                    "unscale_() is being called after step().",
                ))
            }
            Stage::Ready => {}
        }
        let grads: Vec<Tensor> = optimizer
            .parameters()
            .iter()
            .filter_map(|p| p.grad())
            .collect();
        if grads.iter().any(|g| g.dtype() == DType::F16) {
            return Err(Error::invalid(
                "GradScaler::unscale_",
                "Attempting to unscale FP16 gradients.",
            ));
        }
        let _ng = crate::no_grad_guard();
        // the reciprocal in double, then float, as PyTorch's
        let inv = (1.0 / self.scale) as f32;
        // sum(g - g) is 0 for finite gradients and NaN as soon as one element is
        // infinite or NaN (it cannot overflow): two launches per gradient, and the
        // sums meet in one flag
        let mut sums: Vec<Tensor> = Vec::with_capacity(grads.len());
        for g in &grads {
            let probe = g.sub(g)?.sum_all()?.to_dtype(DType::F32)?;
            sums.push(match sums.first() {
                Some(f) if f.device() != probe.device() => probe.to(&f.device())?,
                _ => probe,
            });
            let s = Tensor::full((), inv, DType::F32, &g.device())?;
            g.mul_(&s)?;
        }
        let found = if sums.is_empty() {
            None
        } else {
            let refs: Vec<&Tensor> = sums.iter().collect();
            Some(
                Tensor::stack(&refs, 0)?
                    .sum_all()?
                    .isnan()?
                    .to_dtype(DType::F32)?,
            )
        };
        let state = &mut self.optimizers[i];
        state.found_inf = found;
        state.stage = Stage::Unscaled;
        Ok(())
    }

    /// Unscales (unless [`unscale_`](Self::unscale_) already did) and steps the
    /// optimizer unless a gradient held an infinity or NaN. Returns whether it
    /// stepped. Once between two [`update`](Self::update)s.
    pub fn step(&mut self, optimizer: &mut dyn crate::optim::Optimizer) -> Result<bool> {
        if !self.enabled {
            optimizer.step()?;
            return Ok(true);
        }
        let i = self.state_of(optimizer);
        if self.optimizers[i].stage == Stage::Stepped {
            return Err(Error::invalid(
                "GradScaler::step",
                "step() has already been called since the last update().",
            ));
        }
        if self.optimizers[i].stage == Stage::Ready {
            self.unscale_(optimizer)?;
        }
        let state = &mut self.optimizers[i];
        let skip = match &state.found_inf {
            Some(f) => f.item::<f32>()? > 0.0,
            None => {
                return Err(Error::invalid(
                    "GradScaler::step",
                    "No inf checks were recorded for this optimizer.",
                ))
            }
        };
        state.found = Some(skip);
        state.stage = Stage::Stepped;
        if skip {
            return Ok(false);
        }
        optimizer.step()?;
        Ok(true)
    }

    /// The scale for the next step: times `backoff_factor` when this step found
    /// an infinity or NaN, else times `growth_factor` after `growth_interval`
    /// good steps in a row (kept if that would overflow to infinity).
    pub fn update(&mut self) -> Result<()> {
        if !self.enabled {
            return Ok(());
        }
        if self.optimizers.iter().all(|o| o.found_inf.is_none()) {
            return Err(Error::invalid(
                "GradScaler::update",
                "No inf checks were recorded prior to update.",
            ));
        }
        // what step read, or (unscaled but not stepped) the device's count now
        let mut found = false;
        for o in &self.optimizers {
            found |= match (o.found, &o.found_inf) {
                (Some(f), _) => f,
                (None, Some(t)) => t.item::<f32>()? > 0.0,
                (None, None) => false,
            };
        }
        self.optimizers.clear();
        // the scale is a float32 tensor in PyTorch, multiplied by a double factor
        let scale = self.scale as f32 as f64;
        if found {
            self.scale = (scale * self.backoff_factor) as f32 as f64;
            self.growth_tracker = 0;
        } else {
            self.growth_tracker += 1;
            if self.growth_tracker == self.growth_interval {
                let grown = scale * self.growth_factor;
                if grown.is_finite() {
                    self.scale = grown as f32 as f64;
                }
                self.growth_tracker = 0;
            }
        }
        Ok(())
    }

    /// The index of `optimizer`'s record, made at its first use since the update.
    fn state_of(&mut self, optimizer: &dyn crate::optim::Optimizer) -> usize {
        let key = optimizer_key(optimizer);
        match self.optimizers.iter().position(|o| o.key == key) {
            Some(i) => i,
            None => {
                self.optimizers.push(OptimizerState {
                    key,
                    stage: Stage::Ready,
                    found_inf: None,
                    found: None,
                });
                self.optimizers.len() - 1
            }
        }
    }

    /// PyTorch's `state_dict()`: `scale`, `growth_factor`, `backoff_factor`,
    /// `growth_interval` and `_growth_tracker`; empty when disabled.
    pub fn state_dict(&self) -> Vec<(String, f64)> {
        if !self.enabled {
            return Vec::new();
        }
        vec![
            ("scale".into(), self.scale),
            ("growth_factor".into(), self.growth_factor),
            ("backoff_factor".into(), self.backoff_factor),
            ("growth_interval".into(), self.growth_interval as f64),
            ("_growth_tracker".into(), self.growth_tracker as f64),
        ]
    }

    /// Restores what [`state_dict`](Self::state_dict) returned; every key must be
    /// there and valid (nothing changes on an error). A disabled scaler ignores it.
    pub fn load_state_dict(&mut self, state: &[(String, f64)]) -> Result<()> {
        if !self.enabled {
            return Ok(());
        }
        let get = |k: &str| {
            state
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| *v)
                .ok_or_else(|| {
                    Error::invalid(
                        "GradScaler::load_state_dict",
                        format!("the state has no {k:?}"),
                    )
                })
        };
        let interval = get("growth_interval")?;
        let tracker = get("_growth_tracker")?;
        if interval.fract() != 0.0 || tracker.fract() != 0.0 || tracker < 0.0 {
            return Err(Error::invalid(
                "GradScaler::load_state_dict",
                "growth_interval and _growth_tracker must be whole numbers",
            ));
        }
        let mut next = GradScaler::with_options(
            get("scale")?,
            get("growth_factor")?,
            get("backoff_factor")?,
            interval as u64,
        )?;
        next.growth_tracker = tracker as u64;
        next.enabled = self.enabled;
        *self = next;
        Ok(())
    }
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
