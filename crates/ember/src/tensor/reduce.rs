//! Reductions (`sum`, `mean`, `max`, `min`, `argmax`, `argmin`, `var`, `std`) over
//! all elements or chosen dims, and `softmax` / `log_softmax`.

use super::shape::{dim_list, IntoDims};
use super::{Storages, Tensor};
use crate::autograd::Saved;
use crate::backend::op::{NormAffine, NormSaved, ReduceOp, RowNorm};
use crate::backend::Storage;
use crate::layout::{normalize_dim, Dims};
use crate::{
    dtype::DType,
    error::{Error, Result},
};

/// The gradient of a reduction of `x` over `dims` (output `y`, gradient `g`).
/// Which values a reduction's rule reads: (the input, the output).
fn reduce_saves(op: ReduceOp) -> (bool, bool) {
    match op {
        ReduceOp::Sum | ReduceOp::Mean | ReduceOp::ArgMax | ReduceOp::ArgMin => (false, false),
        ReduceOp::Var(_) => (true, false),
        ReduceOp::Max | ReduceOp::Min | ReduceOp::Std(_) => (true, true),
    }
}

/// The input's gradient of a reduction over `dims` of an input of `shape`; `x` and
/// `y` are the saved input and output where [`reduce_saves`] says the rule reads them.
fn reduce_grad(
    op: ReduceOp,
    shape: &[usize],
    x: Option<&Tensor>,
    y: Option<&Tensor>,
    g: &Tensor,
    dims: &[usize],
) -> Result<Tensor> {
    // the kept-dims shape: size 1 at every reduced dim
    let kept: Vec<usize> = (0..shape.len())
        .map(|d| if dims.contains(&d) { 1 } else { shape[d] })
        .collect();
    let gk = g.reshape(&kept)?;
    let count: usize = dims.iter().map(|&d| shape[d]).product();
    let missing = || Error::invalid("backward", format!("{op:?}: a value was not saved"));
    let x = || x.ok_or_else(missing);
    let y = || y.ok_or_else(missing);
    match op {
        ReduceOp::Sum => gk.expand(shape),
        ReduceOp::Mean => gk.div(count as f64)?.expand(shape),
        ReduceOp::Max | ReduceOp::Min => {
            let (x, y) = (x()?, y()?);
            // ties share the gradient evenly, as in PyTorch's amax/amin
            let mask = x.eq(&y.reshape(&kept)?)?.to_dtype(g.dtype())?;
            let n = mask.sum(dims.to_vec(), true)?;
            gk.mul(&mask)?.div(&n)
        }
        ReduceOp::Var(c) => {
            let x = x()?;
            let mean = x.mean(dims.to_vec(), true)?;
            gk.mul(&x.sub(&mean)?)?.mul(2.0 / (count as f64 - c))
        }
        ReduceOp::Std(c) => {
            // (x - mean) / ((N - correction) · std), as PyTorch's std_backward
            let (x, y) = (x()?, y()?);
            let mean = x.mean(dims.to_vec(), true)?;
            gk.div(&y.reshape(&kept)?)?
                .mul(&x.sub(&mean)?)?
                .div(count as f64 - c)
        }
        ReduceOp::ArgMax | ReduceOp::ArgMin => g.zeros_like(),
    }
}

impl Tensor {
    /// Runs `op` over `dims` (all dims when `None`).
    fn reduce_op(
        &self,
        name: &'static str,
        dims: Option<Dims>,
        keepdim: bool,
        op: ReduceOp,
    ) -> Result<Tensor> {
        if crate::tensor::autocast::cuda_runs_in_f32(name) {
            if let Some(c) = crate::tensor::autocast::to_f32_cuda(&[self])? {
                return c[0].reduce_op(name, dims, keepdim, op);
            }
        }
        if self.rank() == 0 {
            // a 0-d tensor reduces over its one element, whatever dim (0 or -1) was named
            return self.reshape([1])?.reduce_op(name, None, false, op);
        }
        // like PyTorch, an empty dim list means every dim
        let dims: Dims = dims
            .filter(|d| !d.is_empty())
            .unwrap_or_else(|| (0..self.rank()).collect());
        let needs_float = matches!(op, ReduceOp::Mean | ReduceOp::Var(_) | ReduceOp::Std(_));
        if needs_float && !self.dtype().is_float() {
            return Err(Error::dtype(
                name,
                self.dtype(),
                "could not infer output dtype; input dtype must be floating point (use .to_dtype(DType::F32))",
            ));
        }
        let empty_lane = dims.iter().any(|&d| self.shape()[d] == 0);
        if empty_lane
            && !matches!(
                op,
                ReduceOp::Sum | ReduceOp::Mean | ReduceOp::Var(_) | ReduceOp::Std(_)
            )
        {
            return Err(Error::invalid(
                name,
                format!("cannot perform reduction over a zero-size dimension (shape {:?}); there is no identity", self.shape()),
            ));
        }
        let shape: Dims = (0..self.rank())
            .filter_map(|d| {
                if !dims.contains(&d) {
                    Some(self.shape()[d])
                } else if keepdim {
                    Some(1)
                } else {
                    None
                }
            })
            .collect();
        let out = self.map_storage(&shape, |s, l| s.reduce(l, &dims, op))?;
        if matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin) {
            return Ok(out); // indices have no gradient
        }
        Ok(Tensor::record_twice(out, name, &[self], |y| {
            let (sx, sy) = reduce_saves(op);
            let (x, y) = (sx.then(|| self.save()), sy.then(|| y.save()));
            let shape = self.shape().to_vec();
            move |g: &Tensor| {
                let x = x.as_ref().map(Saved::value).transpose()?;
                let y = y.as_ref().map(Saved::value).transpose()?;
                Ok(vec![Some(reduce_grad(
                    op,
                    &shape,
                    x.as_ref(),
                    y.as_ref(),
                    g,
                    &dims,
                )?)])
            }
        }))
    }

    fn reduce_dims(
        &self,
        name: &'static str,
        dims: impl IntoDims,
        keepdim: bool,
        op: ReduceOp,
    ) -> Result<Tensor> {
        let dims = dim_list(name, &dims, self.rank())?;
        self.reduce_op(name, Some(dims), keepdim, op)
    }

    /// Sum of all elements as a 0-d tensor (integers and bools sum to int64).
    pub fn sum_all(&self) -> Result<Tensor> {
        self.reduce_op("sum", None, false, ReduceOp::Sum)
    }

    /// Sum over `dims`; `keepdim` keeps them with size 1.
    pub fn sum(&self, dims: impl IntoDims, keepdim: bool) -> Result<Tensor> {
        self.reduce_dims("sum", dims, keepdim, ReduceOp::Sum)
    }

    /// Mean of all elements (float dtypes).
    pub fn mean_all(&self) -> Result<Tensor> {
        self.reduce_op("mean", None, false, ReduceOp::Mean)
    }

    /// Mean over `dims`.
    pub fn mean(&self, dims: impl IntoDims, keepdim: bool) -> Result<Tensor> {
        self.reduce_dims("mean", dims, keepdim, ReduceOp::Mean)
    }

    /// Largest element; NaN if any element is NaN.
    pub fn max_all(&self) -> Result<Tensor> {
        self.reduce_op("max", None, false, ReduceOp::Max)
    }

    /// Largest values over `dims` (`torch.amax`).
    pub fn max(&self, dims: impl IntoDims, keepdim: bool) -> Result<Tensor> {
        self.reduce_dims("max", dims, keepdim, ReduceOp::Max)
    }

    /// Smallest element; NaN if any element is NaN.
    pub fn min_all(&self) -> Result<Tensor> {
        self.reduce_op("min", None, false, ReduceOp::Min)
    }

    /// Smallest values over `dims` (`torch.amin`).
    pub fn min(&self, dims: impl IntoDims, keepdim: bool) -> Result<Tensor> {
        self.reduce_dims("min", dims, keepdim, ReduceOp::Min)
    }

    /// PyTorch has no argmax / argmin of bools.
    fn check_arg_dtype(&self, name: &'static str) -> Result<()> {
        if self.dtype() == DType::Bool {
            return Err(Error::dtype(
                name,
                DType::Bool,
                format!("{name}(): does not support bool input (convert with .to_dtype() first)"),
            ));
        }
        Ok(())
    }

    /// Flat index (int64) of the first largest element. Bool is refused, as in
    /// PyTorch.
    pub fn argmax_all(&self) -> Result<Tensor> {
        self.check_arg_dtype("argmax")?;
        self.flatten_all()?
            .reduce_op("argmax", None, false, ReduceOp::ArgMax)
    }

    /// Index (int64) of the first largest element along `dim`. Bool is refused.
    pub fn argmax(&self, dim: i64, keepdim: bool) -> Result<Tensor> {
        self.check_arg_dtype("argmax")?;
        self.reduce_dims("argmax", dim, keepdim, ReduceOp::ArgMax)
    }

    /// Flat index (int64) of the first smallest element. Bool is refused.
    pub fn argmin_all(&self) -> Result<Tensor> {
        self.check_arg_dtype("argmin")?;
        self.flatten_all()?
            .reduce_op("argmin", None, false, ReduceOp::ArgMin)
    }

    /// Index (int64) of the first smallest element along `dim`. Bool is refused.
    pub fn argmin(&self, dim: i64, keepdim: bool) -> Result<Tensor> {
        self.check_arg_dtype("argmin")?;
        self.reduce_dims("argmin", dim, keepdim, ReduceOp::ArgMin)
    }

    /// `(values, indices)` of the maxima along `dim` (`torch.max(t, dim)`). The
    /// gradient goes wholly to the returned index (among ties, the first), as in
    /// PyTorch; [`max`](Self::max) (`amax`) shares it among ties instead.
    pub fn max_dim(&self, dim: i64, keepdim: bool) -> Result<(Tensor, Tensor)> {
        self.best_along("max", dim, keepdim, ReduceOp::Max, ReduceOp::ArgMax)
    }

    /// `(values, indices)` of the minima along `dim`; the gradient goes to the
    /// returned index, as in [`max_dim`](Self::max_dim).
    pub fn min_dim(&self, dim: i64, keepdim: bool) -> Result<(Tensor, Tensor)> {
        self.best_along("min", dim, keepdim, ReduceOp::Min, ReduceOp::ArgMin)
    }

    /// The values and indices of `max_dim` / `min_dim`, with the values' gradient
    /// scattered to the indices.
    fn best_along(
        &self,
        name: &'static str,
        dim: i64,
        keepdim: bool,
        value_op: ReduceOp,
        arg_op: ReduceOp,
    ) -> Result<(Tensor, Tensor)> {
        let (values, index) = crate::autograd::no_grad(|| -> Result<(Tensor, Tensor)> {
            Ok((
                self.reduce_dims(name, dim, true, value_op)?,
                self.reduce_dims(name, dim, true, arg_op)?,
            ))
        })?;
        // a 0-d tensor reduces to one element along its one (implicit) dim
        let d = if self.rank() == 0 {
            0
        } else {
            normalize_dim(name, dim, self.rank())?
        };
        let values = Tensor::record_twice(values, name, &[self], |_| {
            let (shape, dtype, device) = (self.shape().to_vec(), self.dtype(), self.device());
            let idx = index.save();
            move |g: &Tensor| {
                let gx = if shape.is_empty() {
                    g.reshape(&shape)?
                } else {
                    // the indices came from argmax / argmin: no check needed
                    let idx = idx.value()?;
                    let gk = g.reshape(idx.shape())?.contiguous()?;
                    Tensor::zeros(&shape, dtype, &device)?.scatter_add_valid(d, idx, &gk)?
                };
                Ok(vec![Some(gx)])
            }
        });
        if keepdim || self.rank() == 0 {
            let (v, i) = if self.rank() == 0 {
                (values.reshape([0usize; 0])?, index.reshape([0usize; 0])?)
            } else {
                (values, index)
            };
            return Ok((v, i));
        }
        Ok((values.squeeze(d as i64)?, index.squeeze(d as i64)?))
    }

    /// Unbiased variance of all elements.
    pub fn var_all(&self) -> Result<Tensor> {
        self.reduce_op("var", None, false, ReduceOp::Var(1.0))
    }

    /// Unbiased variance over `dims` (`torch.var`, correction 1).
    pub fn var(&self, dims: impl IntoDims, keepdim: bool) -> Result<Tensor> {
        self.var_correction(dims, 1.0, keepdim)
    }

    /// Variance over `dims` dividing by `N - correction` (0 gives the population variance).
    pub fn var_correction(
        &self,
        dims: impl IntoDims,
        correction: f64,
        keepdim: bool,
    ) -> Result<Tensor> {
        self.reduce_dims("var", dims, keepdim, ReduceOp::Var(correction))
    }

    /// Unbiased standard deviation of all elements. Computed in f64 (the square
    /// root too) and then narrowed, so values near 1e30 in float32 have a finite
    /// standard deviation even where their variance overflows, as in PyTorch.
    pub fn std_all(&self) -> Result<Tensor> {
        self.reduce_op("std", None, false, ReduceOp::Std(1.0))
    }

    /// Unbiased standard deviation over `dims`.
    pub fn std(&self, dims: impl IntoDims, keepdim: bool) -> Result<Tensor> {
        self.std_correction(dims, 1.0, keepdim)
    }

    /// Standard deviation over `dims` with the given correction.
    pub fn std_correction(
        &self,
        dims: impl IntoDims,
        correction: f64,
        keepdim: bool,
    ) -> Result<Tensor> {
        self.reduce_dims("std", dims, keepdim, ReduceOp::Std(correction))
    }

    fn softmax_impl(&self, name: &'static str, dim: i64, log: bool) -> Result<Tensor> {
        if let Some(c) = crate::tensor::autocast::to_f32_cuda(&[self])? {
            return c[0].softmax_impl(name, dim, log);
        }
        let d = normalize_dim(name, dim, self.rank())?;
        if !self.dtype().is_float() {
            return Err(Error::dtype(
                name,
                self.dtype(),
                "softmax needs a floating-point tensor",
            ));
        }
        if self.rank() == 0 {
            return self.unsqueeze(0)?.softmax_impl(name, 0, log)?.squeeze(0);
        }
        // move `dim` last, compute over contiguous rows, move it back
        let out = crate::autograd::no_grad(|| -> Result<Tensor> {
            let last = self.rank() - 1;
            let t = if d == last {
                self.contiguous()?
            } else {
                self.transpose(d as i64, last as i64)?.contiguous()?
            };
            let out = t.map_storage_same(|s, l| s.softmax(l, log))?;
            if d == last {
                Ok(out)
            } else {
                out.transpose(d as i64, last as i64)?.contiguous()
            }
        })?;
        Ok(Tensor::record_twice(out, name, &[self], |y| {
            let y = y.save();
            move |g: &Tensor| {
                let y = &y.value()?;
                // the one-pass kernel is not recorded: a walk that creates a
                // graph takes the composite
                if d + 1 == y.rank() && y.is_contiguous() && !crate::autograd::creating_graph() {
                    // over the last dim: one pass per row
                    let g = g.contiguous()?;
                    let gx = g.map_storage_same(|s, l| {
                        s.softmax_backward(l, &y.read(), y.layout(), log)
                    })?;
                    return Ok(vec![Some(gx)]);
                }
                let gx = if log {
                    g.sub(&y.exp()?.mul(&g.sum(d, true)?)?)?
                } else {
                    y.mul(&g.sub(&g.mul(y)?.sum(d, true)?)?)?
                };
                Ok(vec![Some(gx)])
            }
        }))
    }

    /// Each row (the last dim) normalised in one pass forward and one backward on
    /// every device: `(x - mean) / sqrt(var + eps)` with the biased variance, or
    /// `x / sqrt(mean(x²) + eps)` with `rms`, then times `weight` and plus `bias`
    /// where given (`[cols]` tensors of the rows' dtype on their device, each given
    /// its gradient; `op` names it in errors). The tensor must be of a float dtype,
    /// with at least one dim. Kept for backward: the rows, each row's mean and
    /// rstd, and the weight (not the normalised rows, which backward recomputes).
    pub(crate) fn normalize_rows(
        &self,
        op: &'static str,
        (eps, rms): (f64, bool),
        (weight, bias): (Option<&Tensor>, Option<&Tensor>),
    ) -> Result<Tensor> {
        if !self.dtype().is_float() || self.rank() == 0 {
            return Err(Error::dtype(
                op,
                self.dtype(),
                "normalisation needs a floating-point tensor with at least one dim",
            ));
        }
        let cols = *self.shape().last().unwrap_or(&1);
        for p in weight.iter().chain(bias.iter()) {
            if p.shape() != [cols] || p.dtype() != self.dtype() {
                return Err(Error::shape(
                    op,
                    p.shape(),
                    &[cols],
                    format!("the affine parts must be [{cols}] in {}", self.dtype()),
                ));
            }
        }
        let rows = self.numel().checked_div(cols).unwrap_or(0);
        let contiguous = |t: Option<&Tensor>| t.map(|t| t.contiguous()).transpose();
        let (x, w, b) = crate::autograd::no_grad(|| -> Result<_> {
            Ok((self.contiguous()?, contiguous(weight)?, contiguous(bias)?))
        })?;
        let (y, stats) = {
            let mut ts = vec![&x];
            ts.extend(&w);
            ts.extend(&b);
            let st = Storages::read(&ts);
            let affine = NormAffine {
                weight: w.as_ref().map(|w| (st.get(1), w.layout())),
                bias: b.as_ref().map(|b| (st.get(ts.len() - 1), b.layout())),
            };
            let (y, stats) = st
                .get(0)
                .norm_rows(x.layout(), RowNorm { eps, rms }, affine)?;
            drop(st);
            (
                Tensor::from_storage(y, self.shape()),
                Tensor::from_storage(stats, &[rows, 2]),
            )
        };
        let mut inputs = vec![self];
        inputs.extend(weight);
        inputs.extend(bias);
        Ok(Tensor::record_twice(y, op, &inputs, |_| {
            let need_x = self.requires_grad();
            let need_w = weight.is_some_and(|w| w.requires_grad());
            let need_b = bias.is_some_and(|b| b.requires_grad());
            let has_b = bias.is_some();
            let x = x.save_as(self);
            let w = w.as_ref().zip(weight).map(|(w, src)| w.save_as(src));
            move |g: &Tensor| {
                if crate::autograd::creating_graph() {
                    // a walk that creates a graph: the gradients in recorded ops
                    let w = w.as_ref().map(|w| w.value()).transpose()?;
                    let (gx, gw, gb) = norm_rows_grads_recorded(
                        &x.value()?,
                        w.as_ref(),
                        g,
                        (eps, rms),
                        (need_x, need_w, need_b),
                    )?;
                    let mut out = vec![gx];
                    if w.is_some() {
                        out.push(gw);
                    }
                    if has_b {
                        out.push(gb);
                    }
                    return Ok(out);
                }
                let g = g.contiguous()?;
                let (x, w) = (x.get()?, w.as_ref().map(|w| w.get()).transpose()?);
                let mut ts = vec![&g, x, &stats];
                ts.extend(w);
                let st = Storages::read(&ts);
                let gs = st.get(0);
                let saved = NormSaved {
                    x: (st.get(1), x.layout()),
                    stats: st.get(2),
                    weight: w.map(|w| (st.get(3), w.layout())),
                };
                let mut gx = None;
                if need_x {
                    let s = gs.norm_rows_backward(g.layout(), saved, rms)?;
                    gx = Some(Tensor::from_storage(s, g.shape()));
                }
                let (mut gw, mut gb) = (None, None);
                if need_w || need_b {
                    let (dw, db) = gs.norm_affine_backward(g.layout(), saved)?;
                    gw = need_w.then(|| Tensor::from_storage(dw, &[cols]));
                    gb = need_b.then(|| Tensor::from_storage(db, &[cols]));
                }
                drop(st);
                // one gradient per input: the rows, then the weight and bias given
                let mut out = vec![gx];
                if w.is_some() {
                    out.push(gw);
                }
                if has_b {
                    out.push(gb);
                }
                Ok(out)
            }
        }))
    }

    /// Each row's cross-entropy for `[M, C]` rows of logits (`self`, a float
    /// dtype) against `target` (`[M]` int64 class indices, each in `0..C` or
    /// `ignore`: the caller checks them): `(1 - ε)(lse - x[t]) + ε (lse - mean(x))`
    /// with `lse = log Σ exp(x)` and `ε = smoothing`, 0 where the target is
    /// `ignore`. One read of the logits forward, one read and one write backward;
    /// kept for backward are the logits (which the caller holds anyway) and each
    /// row's log-sum-exp (as its maximum and the log of the sum below it). The losses come as `[M]` in the statistics dtype
    /// (float32 for half-precision logits, which are widened as they are read,
    /// never copied to float32), the logits' gradient in the logits' dtype.
    /// `opts.half_steps` rounds the log-probabilities to the logits' dtype on
    /// the way ([`CeOpts`](crate::backend::op::CeOpts)).
    pub(crate) fn cross_entropy_rows(
        &self,
        target: &Tensor,
        opts: crate::backend::op::CeOpts,
    ) -> Result<Tensor> {
        let m = self.shape()[0];
        let (loss, lse, x, t) = crate::autograd::no_grad(|| -> Result<_> {
            let (x, t) = (self.contiguous()?, target.contiguous()?);
            let st = Storages::read(&[&x, &t]);
            let (loss, lse) =
                st.get(0)
                    .cross_entropy_rows(x.layout(), (st.get(1), t.layout()), opts)?;
            drop(st);
            let (loss, lse) = (
                Tensor::from_storage(loss, &[m]),
                Tensor::from_storage(lse, &[m, 2]),
            );
            Ok((loss, lse, x, t))
        })?;
        Ok(Tensor::record_twice(loss, "cross_entropy", &[self], |_| {
            let x = x.save_as(self);
            move |g: &Tensor| {
                if crate::autograd::creating_graph() {
                    // a walk that creates a graph: the gradient in recorded ops
                    return Ok(vec![Some(cross_entropy_grad_recorded(
                        &x.value()?,
                        &t,
                        g,
                        opts,
                    )?)]);
                }
                let x = x.get()?;
                let g = g.to_dtype(lse.dtype())?.contiguous()?;
                let st = Storages::read(&[x, &t, &lse, &g]);
                let gx = st.get(0).cross_entropy_rows_backward(
                    x.layout(),
                    (st.get(1), t.layout()),
                    (st.get(2), lse.layout()),
                    (st.get(3), g.layout()),
                    opts,
                )?;
                drop(st);
                Ok(vec![Some(Tensor::from_storage_like(gx, x.layout()))])
            }
        }))
    }

    /// Softmax along `dim`, computed stably (the row max is subtracted first).
    pub fn softmax(&self, dim: i64) -> Result<Tensor> {
        self.softmax_impl("softmax", dim, false)
    }

    /// `log(softmax(x))` along `dim`, computed as `x - max - log(sum(exp(x - max)))`.
    pub fn log_softmax(&self, dim: i64) -> Result<Tensor> {
        self.softmax_impl("log_softmax", dim, true)
    }
}

impl Tensor {
    /// `true` when every `|self - other| <= atol + rtol * |other|`, or the two
    /// are equal (equal infinities are close; NaN never is), shapes broadcast,
    /// like `torch.allclose`. A negative `rtol` or `atol` is an error.
    pub fn allclose(&self, other: &Tensor, rtol: f64, atol: f64) -> Result<bool> {
        let _ng = crate::autograd::no_grad_guard();
        super::math_more::check_tolerances("allclose", rtol, atol)?;
        let (a, b) = (self.to_dtype(DType::F64)?, other.to_dtype(DType::F64)?);
        let mask = super::math_more::close_mask(&a, &b, rtol, atol, false)?;
        let close = mask.to_dtype(DType::I64)?.sum_all()?.item::<i64>()?;
        Ok(close as usize == mask.numel())
    }

    /// The largest `|self - other|` (shapes broadcast); NaN when either holds NaN.
    pub fn max_abs_diff(&self, other: &Tensor) -> Result<f64> {
        let _ng = crate::autograd::no_grad_guard();
        let (a, b) = (self.to_dtype(DType::F64)?, other.to_dtype(DType::F64)?);
        let d = a.sub(&b)?.abs()?;
        if d.numel() == 0 {
            return Ok(0.0);
        }
        d.max_all()?.item::<f64>()
    }

    /// `Ok(())` when [`allclose`](Self::allclose), otherwise an error giving the
    /// largest difference and the tolerances: for checking GPU results against the
    /// CPU's.
    pub fn assert_close(&self, other: &Tensor, rtol: f64, atol: f64) -> Result<()> {
        if self.allclose(other, rtol, atol)? {
            return Ok(());
        }
        Err(Error::invalid(
            "assert_close",
            format!(
                "tensors differ: max |a - b| = {} (rtol {rtol}, atol {atol}; shapes {:?} and {:?})",
                self.max_abs_diff(other)?,
                self.shape(),
                other.shape()
            ),
        ))
    }
}

impl Tensor {
    /// The 2-norm of each of `tensors` as a `[len]` tensor in the statistics dtype
    /// (multi-tensor launches on a GPU: PyTorch's `_foreach_norm`), or `None` where
    /// they do not qualify: all on one GPU (or meta), of one dtype, f32 or f64,
    /// contiguous, each storage once.
    pub(crate) fn foreach_norms(tensors: &[Tensor]) -> Result<Option<Tensor>> {
        if !Tensor::foreach_ready(tensors) {
            return Ok(None);
        }
        let guards: Vec<_> = tensors.iter().map(Tensor::read).collect();
        let items: Vec<(&Storage, usize, usize)> = guards
            .iter()
            .zip(tensors)
            .map(|(g, t)| (&**g, t.layout().offset(), t.numel()))
            .collect();
        let norms = Storage::foreach_norms(&items)?;
        Ok(norms.map(|s| Tensor::from_storage(s, &[tensors.len()])))
    }

    /// Multiplies every one of `tensors` (as [`foreach_norms`](Self::foreach_norms)
    /// takes them) in place by `min(1, max_norm / (total + 1e-6))`, with `total` a
    /// one-element tensor of the statistics dtype on their device, read there.
    /// `Ok(false)` (nothing done) where they do not qualify.
    pub(crate) fn foreach_clip_(tensors: &[Tensor], total: &Tensor, max_norm: f64) -> Result<bool> {
        if !Tensor::foreach_ready(tensors) || total.numel() != 1 || !total.is_contiguous() {
            return Ok(false);
        }
        let t = total.read();
        let mut guards: Vec<_> = tensors.iter().map(Tensor::write).collect();
        let mut items: Vec<(&mut Storage, usize, usize)> = guards
            .iter_mut()
            .zip(tensors)
            .map(|(g, t)| (&mut **g, t.layout().offset(), t.numel()))
            .collect();
        Storage::foreach_clip_scale(&mut items, (&t, total.layout().offset()), max_norm)
    }
}

impl Tensor {
    /// Whether the multi-tensor ops take `tensors`: on one GPU or meta, one dtype
    /// (f32 or f64), each dense (its elements fill the `numel` places from its
    /// offset: row-major, or channels-last and the like), every storage once (each
    /// is locked by the op).
    pub(crate) fn foreach_ready<'a>(tensors: impl IntoIterator<Item = &'a Tensor>) -> bool {
        let mut tensors = tensors.into_iter().peekable();
        let Some(first) = tensors.peek() else {
            return false;
        };
        let (dev, dt) = (first.device(), first.dtype());
        let mut seen = std::collections::HashSet::new();
        matches!(
            dev,
            crate::device::Device::Cuda(_) | crate::device::Device::Meta
        ) && matches!(dt, DType::F32 | DType::F64)
            && tensors.all(|t| {
                t.device() == dev
                    && t.dtype() == dt
                    && (t.is_contiguous() || t.layout().is_non_overlapping_and_dense())
                    && seen.insert(t.storage_key())
            })
    }
}

/// The gradients of [`Tensor::normalize_rows`] (the rows, the weight, the
/// bias; each where `need` asks) for the output gradient `g`, in recorded ops
/// (differentiable again: the rule a walk that creates a graph runs). With
/// `x̂ = (x - mean) · rstd` (or `x · rstd` with `rms`) and `ĝ = g · weight`, the
/// rows' gradient is `rstd · (ĝ - mean(ĝ) - x̂ · mean(ĝ · x̂))` (without the
/// `mean(ĝ)` term with `rms`). The half dtypes are computed in float32.
fn norm_rows_grads_recorded(
    x: &Tensor,
    weight: Option<&Tensor>,
    g: &Tensor,
    (eps, rms): (f64, bool),
    (need_x, need_w, need_b): (bool, bool, bool),
) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
    let dt = x.dtype();
    let work = |t: &Tensor| match dt {
        DType::F16 | DType::BF16 => t.to_dtype(DType::F32),
        _ => Ok(t.clone()),
    };
    let (x, g) = (work(x)?, work(g)?);
    let cols = *x.shape().last().unwrap_or(&1);
    let rows = x.numel().checked_div(cols).unwrap_or(0);
    let centred = match rms {
        true => x.clone(),
        false => x.sub(&x.mean(-1, true)?)?,
    };
    let rstd = centred.square()?.mean(-1, true)?.add(eps)?.rsqrt()?;
    let xhat = centred.mul(&rstd)?;
    let back = |t: Tensor| t.to_dtype(dt);
    let gx = need_x
        .then(|| -> Result<Tensor> {
            let gh = match weight {
                Some(w) => g.mul(&work(w)?)?,
                None => g.clone(),
            };
            let mut inner = gh.sub(&xhat.mul(&gh.mul(&xhat)?.mean(-1, true)?)?)?;
            if !rms {
                inner = inner.sub(&gh.mean(-1, true)?)?;
            }
            back(inner.mul(&rstd)?)
        })
        .transpose()?;
    let per_col = |t: Tensor| -> Result<Tensor> { back(t.reshape([rows, cols])?.sum(0, false)?) };
    let gw = need_w.then(|| per_col(g.mul(&xhat)?)).transpose()?;
    let gb = need_b.then(|| per_col(g.clone())).transpose()?;
    Ok((gx, gw, gb))
}

/// The logits' gradient of [`Tensor::cross_entropy_rows`] for the losses'
/// gradient `g` (`[M]`), in recorded ops (differentiable again: the rule a
/// walk that creates a graph runs): `g · (softmax(x) - (1 - ε)·onehot(t) - ε/C)`
/// per row, 0 in the rows whose target is ignored. The half dtypes are
/// computed in float32 and rounded once.
fn cross_entropy_grad_recorded(
    x: &Tensor,
    target: &Tensor,
    g: &Tensor,
    opts: crate::backend::op::CeOpts,
) -> Result<Tensor> {
    let dt = x.dtype();
    let xw = match dt {
        DType::F16 | DType::BF16 => x.to_dtype(DType::F32)?,
        _ => x.clone(),
    };
    let classes = x.shape()[1];
    let kept = target.ne(opts.ignore)?;
    let t = kept.where_(target, 0)?;
    let eps = opts.smoothing;
    let wanted = t
        .one_hot(classes)?
        .to_dtype(xw.dtype())?
        .mul(1.0 - eps)?
        .add(eps / classes as f64)?;
    let per_row = g
        .to_dtype(xw.dtype())?
        .mul(&kept.to_dtype(xw.dtype())?)?
        .unsqueeze(1)?;
    xw.softmax(1)?.sub(&wanted)?.mul(&per_row)?.to_dtype(dt)
}
