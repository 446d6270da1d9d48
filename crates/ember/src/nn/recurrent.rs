//! Recurrent layers: `nn.LSTM`, `nn.GRU`, `nn.LSTMCell` and `nn.GRUCell`, with
//! PyTorch's parameter names (`weight_ih_l0`, `bias_hh_l1_reverse`, ...), gate
//! order (LSTM: input, forget, cell, output; GRU: reset, update, new), layouts
//! and initial values (uniform in `±1/sqrt(hidden_size)`). The machinery here
//! also runs the Elman layers of `nn/rnn.rs` (one gate and a nonlinearity).
//!
//! Each layer projects the whole input sequence with one matrix product, then
//! steps through time with the hidden-to-hidden product; autograd records the
//! steps (backpropagation through time).

use super::functional::dropout;
use super::rnn::RnnNonlinearity;
use super::{assign, fresh_parameter, Module};
use crate::{
    device::Device,
    dtype::DType,
    error::{Error, Result},
    tensor::Tensor,
};

/// Which cell a recurrent layer runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Cell {
    Lstm,
    Gru,
    /// The Elman cell: `act(x Wᵢₕᵀ + bᵢₕ + h Wₕₕᵀ + bₕₕ)`.
    Rnn(RnnNonlinearity),
}

impl Cell {
    fn gates(self) -> usize {
        match self {
            Cell::Lstm => 4,
            Cell::Gru => 3,
            Cell::Rnn(_) => 1,
        }
    }

    /// The sequence layer's name, which PyTorch's messages begin with.
    fn name(self) -> &'static str {
        match self {
            Cell::Lstm => "LSTM",
            Cell::Gru => "GRU",
            Cell::Rnn(_) => "RNN",
        }
    }

    /// The single-step layer's name.
    fn cell_name(self) -> &'static str {
        match self {
            Cell::Lstm => "LSTMCell",
            Cell::Gru => "GRUCell",
            Cell::Rnn(_) => "RNNCell",
        }
    }

    fn has_cell_state(self) -> bool {
        self == Cell::Lstm
    }
}

/// The settings of [`LSTM`], [`GRU`] and [`RNN`](super::RNN) (PyTorch's
/// keyword arguments; the defaults are PyTorch's).
#[derive(Clone, Copy, Debug)]
pub struct RnnOptions {
    pub num_layers: usize,
    pub bias: bool,
    /// Inputs and outputs `[N, L, features]` instead of `[L, N, features]`.
    pub batch_first: bool,
    /// Dropout on the outputs of every layer but the last, in training.
    pub dropout: f64,
    pub bidirectional: bool,
}

impl Default for RnnOptions {
    fn default() -> Self {
        RnnOptions {
            num_layers: 1,
            bias: true,
            batch_first: false,
            dropout: 0.0,
            bidirectional: false,
        }
    }
}

/// The parameters of one cell: `weight_ih [G·H, in]`, `weight_hh [G·H, H]` and
/// the optional biases `[G·H]`.
struct CellParams {
    w_ih: Tensor,
    w_hh: Tensor,
    b_ih: Option<Tensor>,
    b_hh: Option<Tensor>,
}

impl CellParams {
    fn new(cell: Cell, input: usize, hidden: usize, bias: bool, device: &Device) -> Result<Self> {
        let (g, k) = (cell.gates() * hidden, bound(hidden));
        let draw = |shape: &[usize]| -> Result<Tensor> {
            fresh_parameter(Tensor::uniform(-k, k, shape, DType::F32, device)?)
        };
        Ok(CellParams {
            w_ih: draw(&[g, input])?,
            w_hh: draw(&[g, hidden])?,
            b_ih: bias.then(|| draw(&[g])).transpose()?,
            b_hh: bias.then(|| draw(&[g])).transpose()?,
        })
    }

    fn named(&self, suffix: &str) -> Vec<(String, Tensor)> {
        let mut v = vec![
            (format!("weight_ih{suffix}"), self.w_ih.clone()),
            (format!("weight_hh{suffix}"), self.w_hh.clone()),
        ];
        if let (Some(bi), Some(bh)) = (&self.b_ih, &self.b_hh) {
            v.push((format!("bias_ih{suffix}"), bi.clone()));
            v.push((format!("bias_hh{suffix}"), bh.clone()));
        }
        v
    }

    fn map(&mut self, f: impl Fn(&Tensor) -> Result<Tensor>) -> Result<()> {
        self.w_ih = f(&self.w_ih)?;
        self.w_hh = f(&self.w_hh)?;
        for b in [&mut self.b_ih, &mut self.b_hh].into_iter().flatten() {
            *b = f(b)?;
        }
        Ok(())
    }

    fn reset(&self) -> Result<()> {
        let k = bound(self.w_hh.shape()[1]);
        let all = [
            Some(&self.w_ih),
            Some(&self.w_hh),
            self.b_ih.as_ref(),
            self.b_hh.as_ref(),
        ];
        for p in all.into_iter().flatten() {
            assign(
                p,
                &Tensor::uniform(-k, k, p.shape(), p.dtype(), &p.device())?,
            )?;
        }
        Ok(())
    }

    /// `x Wᵢₕᵀ + bᵢₕ` for inputs `[.., in]`.
    /// (Under autocast the weight and bias are cast here, before the transpose:
    /// once per region, and the sum stays in the lower precision.)
    fn input_part(&self, x: &Tensor) -> Result<Tensor> {
        let y = x.matmul(&crate::tensor::autocast::lower_one(&self.w_ih)?.t()?)?;
        match &self.b_ih {
            Some(b) => y.add(&crate::tensor::autocast::lower_one(b)?),
            None => Ok(y),
        }
    }

    /// `h Wₕₕᵀ + bₕₕ`.
    fn hidden_part(&self, h: &Tensor) -> Result<Tensor> {
        let y = h.matmul(&crate::tensor::autocast::lower_one(&self.w_hh)?.t()?)?;
        match &self.b_hh {
            Some(b) => y.add(&crate::tensor::autocast::lower_one(b)?),
            None => Ok(y),
        }
    }

    /// One step from the input part `xi [N, G·H]` (already projected) and the
    /// state: the new hidden state, and the new cell state for an LSTM.
    fn step(
        &self,
        cell: Cell,
        xi: &Tensor,
        h: &Tensor,
        c: Option<&Tensor>,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let hidden = self.w_hh.shape()[1];
        let hh = self.hidden_part(h)?;
        let chunk = |t: &Tensor, i: usize| t.narrow(-1, (i * hidden) as i64, hidden);
        match cell {
            Cell::Lstm => {
                let g = xi.add(&hh)?;
                let i = chunk(&g, 0)?.sigmoid()?;
                let f = chunk(&g, 1)?.sigmoid()?;
                let gg = chunk(&g, 2)?.tanh()?;
                let o = chunk(&g, 3)?.sigmoid()?;
                let c = c.expect("an LSTM step has a cell state");
                let c2 = f.mul(c)?.add(&i.mul(&gg)?)?;
                let h2 = o.mul(&c2.tanh()?)?;
                Ok((h2, Some(c2)))
            }
            Cell::Gru => {
                let r = chunk(xi, 0)?.add(&chunk(&hh, 0)?)?.sigmoid()?;
                let z = chunk(xi, 1)?.add(&chunk(&hh, 1)?)?.sigmoid()?;
                let n = chunk(xi, 2)?.add(&r.mul(&chunk(&hh, 2)?)?)?.tanh()?;
                // (1 - z) n + z h = n + z (h - n)
                let h2 = n.add(&z.mul(&h.sub(&n)?)?)?;
                Ok((h2, None))
            }
            Cell::Rnn(act) => Ok((act.apply(&xi.add(&hh)?)?, None)),
        }
    }
}

/// PyTorch's initial values lie in `±1/sqrt(hidden_size)`.
fn bound(hidden: usize) -> f64 {
    if hidden > 0 {
        1.0 / (hidden as f64).sqrt()
    } else {
        0.0
    }
}

/// Refuses the first of `sizes` that is zero, naming it as PyTorch does.
fn positive(cell: Cell, sizes: &[(&str, usize)]) -> Result<()> {
    match sizes.iter().find(|(_, n)| *n == 0) {
        Some((what, _)) => Err(Error::invalid(
            cell.name(),
            format!("{what} must be greater than zero"),
        )),
        None => Ok(()),
    }
}

/// A multi-layer, optionally bidirectional recurrent network of one cell kind
/// (a single-step cell is one layer in one direction).
pub(super) struct Recurrent {
    pub(super) cell: Cell,
    /// `[layer][direction]`.
    params: Vec<Vec<CellParams>>,
    input_size: usize,
    hidden_size: usize,
    pub(super) options: RnnOptions,
    pub(super) training: bool,
    /// A single-step cell (`nn.LSTMCell`, ...) rather than a sequence layer.
    single_step: bool,
}

impl Recurrent {
    /// A whole sequence layer (`nn.LSTM`, `nn.GRU`, `nn.RNN`), which PyTorch
    /// refuses without inputs, hidden features or layers (its cells accept
    /// sizes of zero).
    pub(super) fn sequence(
        cell: Cell,
        input_size: usize,
        hidden_size: usize,
        options: RnnOptions,
        device: &Device,
    ) -> Result<Self> {
        positive(
            cell,
            &[
                ("input_size", input_size),
                ("hidden_size", hidden_size),
                ("num_layers", options.num_layers),
            ],
        )?;
        Recurrent::new(cell, input_size, hidden_size, options, device)
    }

    /// A single-step cell (`nn.LSTMCell`, `nn.GRUCell`, `nn.RNNCell`).
    pub(super) fn cell(
        cell: Cell,
        input_size: usize,
        hidden_size: usize,
        bias: bool,
        device: &Device,
    ) -> Result<Self> {
        let options = RnnOptions {
            bias,
            ..Default::default()
        };
        let mut r = Recurrent::new(cell, input_size, hidden_size, options, device)?;
        r.single_step = true;
        Ok(r)
    }

    fn new(
        cell: Cell,
        input_size: usize,
        hidden_size: usize,
        options: RnnOptions,
        device: &Device,
    ) -> Result<Self> {
        if !(0.0..=1.0).contains(&options.dropout) {
            return Err(Error::invalid(
                cell.name(),
                "dropout should be a number in range [0, 1] representing the probability of an element being zeroed",
            ));
        }
        let dirs = if options.bidirectional { 2 } else { 1 };
        let mut params = Vec::with_capacity(options.num_layers);
        for layer in 0..options.num_layers {
            let input = if layer == 0 {
                input_size
            } else {
                hidden_size * dirs
            };
            params.push(
                (0..dirs)
                    .map(|_| CellParams::new(cell, input, hidden_size, options.bias, device))
                    .collect::<Result<Vec<_>>>()?,
            );
        }
        Ok(Recurrent {
            cell,
            params,
            input_size,
            hidden_size,
            options,
            training: true,
            single_step: false,
        })
    }

    fn dirs(&self) -> usize {
        if self.options.bidirectional {
            2
        } else {
            1
        }
    }

    /// PyTorch's names: a cell's without a layer suffix.
    pub(super) fn named_parameters(&self) -> Vec<(String, Tensor)> {
        if self.single_step {
            return self.params[0][0].named("");
        }
        let mut v = Vec::new();
        for (l, layer) in self.params.iter().enumerate() {
            for (d, p) in layer.iter().enumerate() {
                v.extend(p.named(&format!("_l{l}{}", if d == 1 { "_reverse" } else { "" })));
            }
        }
        v
    }

    /// A sequence layer's output from zero states, or a cell's next state.
    pub(super) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if self.single_step {
            Ok(self.step_once(x, None, None)?.0)
        } else {
            Ok(self.run(x, None, None)?.0)
        }
    }

    pub(super) fn map(&mut self, f: impl Fn(&Tensor) -> Result<Tensor> + Copy) -> Result<()> {
        self.params.iter_mut().flatten().try_for_each(|p| p.map(f))
    }

    pub(super) fn reset_parameters(&self) -> Result<()> {
        self.params.iter().flatten().try_for_each(CellParams::reset)
    }

    /// The output sequence and the final states (`h_n`, and `c_n` for an LSTM).
    /// `state` holds the initial `h_0` (and `c_0`), `[layers·dirs, N, H]`.
    pub(super) fn run(
        &self,
        x: &Tensor,
        h0: Option<&Tensor>,
        c0: Option<&Tensor>,
    ) -> Result<(Tensor, Tensor, Option<Tensor>)> {
        // (a GRU or an Elman layer on the CPU keeps its input and states: see
        // cpu_full_precision)
        let lower = |t: &Tensor| {
            if !self.cell.has_cell_state() && cpu_full_precision(t) {
                Ok(t.clone())
            } else {
                crate::tensor::autocast::lower_one(t)
            }
        };
        let name = self.cell.name();
        let batched = match x.rank() {
            3 => true,
            2 => false,
            r => {
                // (PyTorch's RNN says "{r}D tensor", its LSTM and GRU "{r}D")
                let noun = if matches!(self.cell, Cell::Rnn(_)) {
                    " tensor"
                } else {
                    ""
                };
                return Err(Error::invalid(
                    name,
                    format!(
                        "Expected input to be 2D or 3D, got {r}D{noun} instead (input of shape {:?})",
                        x.shape()
                    ),
                ));
            }
        };
        state_ranks(self.cell, batched, h0, c0)?;
        // [L, N, in]
        let x = match (batched, self.options.batch_first) {
            (false, _) => x.unsqueeze(1)?,
            (true, true) => x.transpose(0, 1)?,
            (true, false) => x.clone(),
        };
        // under autocast the input and the states run in the lower precision, as
        // PyTorch's CUDA autocast runs its recurrent layers (cuDNN's RNN), and
        // its CPU autocast its LSTM (a GRU on the CPU has left autocast above)
        let x = lower(&x)?;
        let wdt = lower(&self.params[0][0].w_ih)?.dtype();
        if x.dtype() != wdt {
            return Err(Error::invalid(
                name,
                format!(
                    "RNN input dtype ({}) does not match weight dtype ({wdt}). Convert the \
                     input: input.to_dtype(DType::{wdt:?}), or the model: \
                     model.to_dtype(DType::{:?})",
                    x.dtype(),
                    x.dtype()
                ),
            ));
        }
        if x.shape()[2] != self.input_size {
            return Err(Error::shape(
                name,
                x.shape(),
                &[self.input_size],
                format!(
                    "input.size(-1) must be equal to input_size. Expected {}, got {}",
                    self.input_size,
                    x.shape()[2]
                ),
            ));
        }
        let (steps, n, hsz) = (x.shape()[0], x.shape()[1], self.hidden_size);
        if steps == 0 {
            return Err(Error::invalid(
                name,
                "Expected sequence length to be larger than 0 in RNN",
            ));
        }
        let dirs = self.dirs();
        let states = self.options.num_layers * dirs;
        let initial = |s: Option<&Tensor>, what: &str| -> Result<Tensor> {
            match s {
                None => Tensor::zeros([states, n, hsz], x.dtype(), &x.device()),
                Some(s) => {
                    let s = if batched { s.clone() } else { s.unsqueeze(1)? };
                    if s.shape() != [states, n, hsz] {
                        return Err(Error::shape(
                            name,
                            s.shape(),
                            &[states, n, hsz],
                            format!(
                                "Expected {what} size ({states}, {n}, {hsz}), got {:?}",
                                s.shape()
                            ),
                        ));
                    }
                    lower(&s)
                }
            }
        };
        let h0 = initial(h0, "hidden")?;
        let c0 = if self.cell.has_cell_state() {
            Some(initial(c0, "cell")?)
        } else {
            None
        };
        let mut layer_in = x;
        let (mut hn, mut cn) = (Vec::with_capacity(states), Vec::with_capacity(states));
        for (l, layer) in self.params.iter().enumerate() {
            let mut outs = Vec::with_capacity(dirs);
            for (d, p) in layer.iter().enumerate() {
                let k = (l * dirs + d) as i64;
                let mut h = h0.select(0, k)?;
                let mut c = c0.as_ref().map(|c| c.select(0, k)).transpose()?;
                // the input projections of every step at once: [L, N, G·H]
                let xi = p.input_part(&layer_in)?;
                let mut seq = vec![None; steps];
                for s in 0..steps {
                    let t = if d == 0 { s } else { steps - 1 - s };
                    let (h2, c2) = p.step(self.cell, &xi.select(0, t as i64)?, &h, c.as_ref())?;
                    seq[t] = Some(h2.clone());
                    h = h2;
                    c = c2;
                }
                let seq: Vec<Tensor> = seq.into_iter().map(|t| t.expect("every step")).collect();
                let refs: Vec<&Tensor> = seq.iter().collect();
                outs.push(Tensor::stack(&refs, 0)?);
                hn.push(h);
                if let Some(c) = c {
                    cn.push(c);
                }
            }
            let refs: Vec<&Tensor> = outs.iter().collect();
            layer_in = if dirs == 1 {
                outs[0].clone()
            } else {
                Tensor::cat(&refs, 2)?
            };
            if l + 1 < self.params.len() {
                layer_in = dropout(&layer_in, self.options.dropout, self.training)?;
            }
        }
        let out = match (batched, self.options.batch_first) {
            (false, _) => layer_in.squeeze(1)?,
            (true, true) => layer_in.transpose(0, 1)?,
            (true, false) => layer_in,
        };
        let stack = |v: &[Tensor]| -> Result<Tensor> {
            let refs: Vec<&Tensor> = v.iter().collect();
            let s = Tensor::stack(&refs, 0)?;
            if batched {
                Ok(s)
            } else {
                s.squeeze(1)
            }
        };
        let hn = stack(&hn)?;
        let cn = if cn.is_empty() {
            None
        } else {
            Some(stack(&cn)?)
        };
        Ok((out, hn, cn))
    }

    /// One step of a single-step cell from `x` `[N, in]` (or `[in]`) and the
    /// state (zeros when `None`): the new hidden state, and the new cell state
    /// for an LSTM cell, each `[N, H]` (or `[H]`).
    pub(super) fn step_once(
        &self,
        x: &Tensor,
        h: Option<&Tensor>,
        c: Option<&Tensor>,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let (name, hsz) = (self.cell.cell_name(), self.hidden_size);
        let batched = match x.rank() {
            2 => true,
            1 => false,
            k => {
                return Err(Error::invalid(
                    name,
                    format!("Expected input to be 1D or 2D, got {k}D instead"),
                ))
            }
        };
        let ranks = [h, c].map(|s| s.map_or(1, Tensor::rank));
        if let Some(i) = ranks.iter().position(|k| !(1..=2).contains(k)) {
            // (PyTorch's LSTM cell names its states hx[0] and hx[1])
            let what = match self.cell {
                Cell::Lstm => format!("hx[{i}]"),
                _ => "hidden".into(),
            };
            let msg = format!("Expected {what} to be 1D or 2D, got {}D instead", ranks[i]);
            return Err(Error::invalid(name, msg));
        }
        let x = if batched { x.clone() } else { x.unsqueeze(0)? };
        if x.shape()[1] != self.input_size {
            return Err(Error::shape(
                name,
                x.shape(),
                &[self.input_size],
                format!(
                    "input has inconsistent input_size: got {} expected {}",
                    x.shape()[1],
                    self.input_size
                ),
            ));
        }
        let n = x.shape()[0];
        let state = |s: Option<&Tensor>, i: usize| -> Result<Tensor> {
            let Some(s) = s else {
                return Tensor::zeros([n, hsz], x.dtype(), &x.device());
            };
            let s = if batched { s.clone() } else { s.unsqueeze(0)? };
            let msg = if s.rank() != 2 {
                format!(
                    "Expected 2D hidden{i} (batch x hidden_size), but got {}D tensor",
                    s.rank()
                )
            } else if s.shape()[0] != n {
                format!(
                    "Input batch size {n} doesn't match hidden{i} batch size {}",
                    s.shape()[0]
                )
            } else if s.shape()[1] != hsz {
                format!(
                    "hidden{i} has inconsistent hidden_size: got {}, expected {hsz}",
                    s.shape()[1]
                )
            } else {
                return Ok(s);
            };
            Err(Error::shape(name, s.shape(), &[n, hsz], msg))
        };
        let h = state(h, 0)?;
        let c = if self.cell.has_cell_state() {
            Some(state(c, 1)?)
        } else {
            None
        };
        // under CUDA autocast the step runs in the lower precision, as PyTorch's
        // lstm_cell, gru_cell and rnn_*_cell are on its list (the CPU's are not:
        // there only the products are lowered)
        let low = |t: &Tensor| {
            if cpu_full_precision(t) {
                Ok(t.clone())
            } else {
                crate::tensor::autocast::lower_one(t)
            }
        };
        let (x, h, c) = (low(&x)?, low(&h)?, c.as_ref().map(low).transpose()?);
        let p = &self.params[0][0];
        let (h2, c2) = p.step(self.cell, &p.input_part(&x)?, &h, c.as_ref())?;
        let un = |t: Tensor| if batched { Ok(t) } else { t.squeeze(0) };
        Ok((un(h2)?, c2.map(un).transpose()?))
    }
}

/// Refuses initial states whose rank does not follow the input's (3-D for a
/// batch, 2-D for one sequence), with PyTorch's messages.
fn state_ranks(cell: Cell, batched: bool, h: Option<&Tensor>, c: Option<&Tensor>) -> Result<()> {
    let (rank, what) = if batched {
        (3, "batched 3-D")
    } else {
        (2, "unbatched 2-D")
    };
    let r = |s: Option<&Tensor>| s.map_or(rank, Tensor::rank);
    if r(h) == rank && r(c) == rank {
        return Ok(());
    }
    let msg = if cell.has_cell_state() {
        let (h, c) = (r(h), r(c));
        format!(
            "For {what} input, hx and cx should also be {rank}-D but got ({h}-D, {c}-D) tensors"
        )
    } else {
        format!(
            "For {what} input, hx should also be {rank}-D but got {}-D tensor",
            r(h)
        )
    };
    Err(Error::invalid(cell.name(), msg))
}

/// Whether `x` is on the CPU under CPU autocast, where PyTorch's `GRU`, `RNN`
/// and single-step cells keep their input and states in float32 (its CPU list
/// has `LSTM`'s oneDNN layer, not theirs; CUDA's has them all): their products
/// with the weights still run in the lower precision (their linear layers are
/// on the list); a GRU's sums with the float32 states come back float32, an
/// Elman cell's state is its products' sum, in the lower precision.
fn cpu_full_precision(x: &Tensor) -> bool {
    x.device() == Device::Cpu
        && crate::tensor::autocast::is_autocast_enabled(crate::tensor::autocast::DeviceType::Cpu)
}

/// `Module` for a newtype over [`Recurrent`]: a sequence layer's forward is the
/// output sequence from zero states, a cell's the state after one step from
/// zeros.
macro_rules! recurrent_module {
    ($t:ident) => {
        impl Module for $t {
            fn forward(&self, x: &Tensor) -> Result<Tensor> {
                self.0.forward(x)
            }
            fn named_parameters(&self) -> Vec<(String, Tensor)> {
                self.0.named_parameters()
            }
            fn to_device(&mut self, device: &Device) -> Result<()> {
                self.0.map(|t| super::move_parameter(t, device))
            }
            fn to_empty(&mut self, device: &Device) -> Result<()> {
                self.0.map(|t| super::empty_parameter(t, device))
            }
            fn to_dtype(&mut self, dtype: DType) -> Result<()> {
                self.0.map(|t| super::cast_state(t, dtype))
            }
            fn reset_parameters(&mut self) -> Result<()> {
                self.0.reset_parameters()
            }
            fn set_training(&mut self, training: bool) {
                self.0.training = training;
            }
        }
    };
}
pub(super) use recurrent_module;

/// A multi-layer LSTM (`nn.LSTM`). Input `[L, N, input_size]` (`[N, L, ...]` with
/// `batch_first`, or unbatched `[L, input_size]`); output `[L, N, dirs·H]`.
pub struct LSTM(Recurrent);

impl LSTM {
    pub fn new(input_size: usize, hidden_size: usize, device: &Device) -> Result<LSTM> {
        LSTM::with_options(input_size, hidden_size, RnnOptions::default(), device)
    }

    pub fn with_options(
        input_size: usize,
        hidden_size: usize,
        options: RnnOptions,
        device: &Device,
    ) -> Result<LSTM> {
        Recurrent::sequence(Cell::Lstm, input_size, hidden_size, options, device).map(LSTM)
    }

    /// The output sequence and the final `(h_n, c_n)`, each `[layers·dirs, N, H]`,
    /// from the initial `(h_0, c_0)` (zeros when `None`).
    pub fn forward_state(
        &self,
        x: &Tensor,
        state: Option<(&Tensor, &Tensor)>,
    ) -> Result<(Tensor, (Tensor, Tensor))> {
        let (out, h, c) = self.0.run(x, state.map(|s| s.0), state.map(|s| s.1))?;
        Ok((out, (h, c.expect("an LSTM has a cell state"))))
    }

    pub fn options(&self) -> RnnOptions {
        self.0.options
    }
}

recurrent_module!(LSTM);

/// A multi-layer GRU (`nn.GRU`), with [`LSTM`]'s layouts.
pub struct GRU(Recurrent);

impl GRU {
    pub fn new(input_size: usize, hidden_size: usize, device: &Device) -> Result<GRU> {
        GRU::with_options(input_size, hidden_size, RnnOptions::default(), device)
    }

    pub fn with_options(
        input_size: usize,
        hidden_size: usize,
        options: RnnOptions,
        device: &Device,
    ) -> Result<GRU> {
        Recurrent::sequence(Cell::Gru, input_size, hidden_size, options, device).map(GRU)
    }

    /// The output sequence and the final `h_n` from the initial `h_0` (zeros when
    /// `None`).
    pub fn forward_state(&self, x: &Tensor, h0: Option<&Tensor>) -> Result<(Tensor, Tensor)> {
        let (out, h, _) = self.0.run(x, h0, None)?;
        Ok((out, h))
    }

    pub fn options(&self) -> RnnOptions {
        self.0.options
    }
}

recurrent_module!(GRU);

/// One LSTM step (`nn.LSTMCell`): parameters `weight_ih`, `weight_hh`, `bias_ih`,
/// `bias_hh`; input `[N, input_size]` (or `[input_size]`).
pub struct LSTMCell(Recurrent);

/// One GRU step (`nn.GRUCell`).
pub struct GRUCell(Recurrent);

macro_rules! cell_constructors {
    ($t:ident, $cell:expr) => {
        impl $t {
            /// A cell with biases.
            pub fn new(input_size: usize, hidden_size: usize, device: &Device) -> Result<$t> {
                Self::with_bias(input_size, hidden_size, true, device)
            }

            /// A cell with or without biases.
            pub fn with_bias(
                input_size: usize,
                hidden_size: usize,
                bias: bool,
                device: &Device,
            ) -> Result<$t> {
                Recurrent::cell($cell, input_size, hidden_size, bias, device).map($t)
            }
        }

        recurrent_module!($t);
    };
}

cell_constructors!(LSTMCell, Cell::Lstm);
cell_constructors!(GRUCell, Cell::Gru);

impl LSTMCell {
    /// `(h', c')` after one step from `(h, c)` (zeros when `None`).
    pub fn step(&self, x: &Tensor, state: Option<(&Tensor, &Tensor)>) -> Result<(Tensor, Tensor)> {
        let (h, c) = state.unzip();
        let (h, c) = self.0.step_once(x, h, c)?;
        Ok((h, c.expect("an LSTM cell has a cell state")))
    }
}

impl GRUCell {
    /// `h'` after one step from `h` (zeros when `None`).
    pub fn step(&self, x: &Tensor, h: Option<&Tensor>) -> Result<Tensor> {
        Ok(self.0.step_once(x, h, None)?.0)
    }
}
