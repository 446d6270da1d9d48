//! Dynamic loss scaling for float16 training (`torch.amp.GradScaler`), public
//! as `ember::amp::GradScaler` (and `ember::optim::GradScaler`).

use crate::{
    dtype::DType,
    error::{Error, Result},
    tensor::Tensor,
};

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
    /// [`optimizer_key`]: the optimizer this record belongs to, wherever it
    /// has moved since (records last until the next update).
    key: (usize, usize),
    stage: Stage,
    found_inf: Option<Tensor>,
    found: Option<bool>,
}

/// Identifies an optimizer as PyTorch's `id(optimizer)` does, by the address
/// of its list of parameters (its own allocation, which stays put when the
/// optimizer moves: the optimizer's own address changes then, and an optimizer
/// unscaled and then moved would be unscaled twice), or, with no parameters,
/// by its address.
fn optimizer_key(o: &dyn crate::optim::Optimizer) -> (usize, usize) {
    let params = o.parameters();
    if params.is_empty() {
        (
            o as *const dyn crate::optim::Optimizer as *const () as usize,
            0,
        )
    } else {
        (params.as_ptr() as usize, params.len())
    }
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
        // (the scale is a float32, as PyTorch's)
        let as_f32 = init_scale as f32;
        if !(as_f32.is_finite() && as_f32 > 0.0) {
            return bad("the initial scale must be a positive number finite in float32");
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
        let _ng = crate::autograd::no_grad_guard();
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
                // a scale that would overflow float32 stays where it is
                let grown = (scale * self.growth_factor) as f32;
                if grown.is_finite() {
                    self.scale = grown as f64;
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
        if state.is_empty() {
            return Err(Error::invalid(
                "GradScaler::load_state_dict",
                "The source state dict is empty, possibly because it was saved from a \
                 disabled instance of GradScaler.",
            ));
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
