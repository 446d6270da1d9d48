//! The Elman recurrent layers `nn.RNN` and `nn.RNNCell`: each step computes
//! `h' = act(x Wᵢₕᵀ + bᵢₕ + h Wₕₕᵀ + bₕₕ)` with `act` tanh or ReLU. They run on
//! the machinery of `nn/recurrent.rs` as a cell with one gate, so they share
//! the LSTM's and GRU's layouts (`batch_first`, unbatched inputs, stacked and
//! bidirectional layers), checks, autocast rules and PyTorch's parameter names
//! (`weight_ih_l0`, `bias_hh_l1_reverse`, ...) and initial values (uniform in
//! `±1/sqrt(hidden_size)`).
//!
//! ```
//! use ember::nn::{self, Module, RnnNonlinearity, RnnOptions};
//! use ember::prelude::*;
//! let dev = Device::Cpu;
//! let options = RnnOptions {
//!     num_layers: 2,
//!     bidirectional: true,
//!     ..Default::default()
//! };
//! let rnn = nn::RNN::with_options(3, 4, RnnNonlinearity::Relu, options, &dev)?;
//! let x = Tensor::randn([5, 2, 3], &dev)?; // [steps, batch, input_size]
//! let (y, h_n) = rnn.forward_state(&x, None)?;
//! assert_eq!(y.shape(), &[5, 2, 8]); // both directions' features
//! assert_eq!(h_n.shape(), &[4, 2, 4]); // [layers · directions, batch, hidden]
//!
//! let cell = nn::RNNCell::new(3, 4, &dev)?;
//! let h = cell.step(&x.select(0, 0)?, None)?;
//! assert_eq!(cell.step(&x.select(0, 1)?, Some(&h))?.shape(), &[2, 4]);
//! # Ok::<(), ember::Error>(())
//! ```

use super::recurrent::{recurrent_module, Cell, Recurrent, RnnOptions};
use super::Module;
use crate::{
    device::Device,
    dtype::DType,
    error::{Error, Result},
    tensor::Tensor,
};

/// The nonlinearity of an Elman layer (PyTorch's `nonlinearity` argument);
/// `"tanh".parse()` and `"relu".parse()` read PyTorch's spellings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RnnNonlinearity {
    #[default]
    Tanh,
    Relu,
}

impl RnnNonlinearity {
    /// PyTorch's spelling: `"tanh"` or `"relu"`.
    pub fn as_str(self) -> &'static str {
        match self {
            RnnNonlinearity::Tanh => "tanh",
            RnnNonlinearity::Relu => "relu",
        }
    }

    pub(super) fn apply(self, x: &Tensor) -> Result<Tensor> {
        match self {
            RnnNonlinearity::Tanh => x.tanh(),
            RnnNonlinearity::Relu => x.relu(),
        }
    }
}

impl std::str::FromStr for RnnNonlinearity {
    type Err = Error;

    /// Refuses any other name with PyTorch's message.
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "tanh" => Ok(RnnNonlinearity::Tanh),
            "relu" => Ok(RnnNonlinearity::Relu),
            _ => Err(Error::invalid(
                "RNN",
                format!("Unknown nonlinearity '{s}'. Select from 'tanh' or 'relu'."),
            )),
        }
    }
}

/// A multi-layer Elman network (`nn.RNN`), with [`LSTM`](super::LSTM)'s
/// layouts: input `[L, N, input_size]` (`[N, L, input_size]` with
/// `batch_first`, or unbatched `[L, input_size]`), output `[L, N, dirs·H]`, and
/// `h_0`/`h_n` `[layers·dirs, N, H]` (`[layers·dirs, H]` unbatched).
pub struct RNN(Recurrent);

impl RNN {
    /// One layer of tanh steps, with biases (PyTorch's defaults).
    pub fn new(input_size: usize, hidden_size: usize, device: &Device) -> Result<RNN> {
        RNN::with_options(
            input_size,
            hidden_size,
            RnnNonlinearity::Tanh,
            RnnOptions::default(),
            device,
        )
    }

    /// Refuses sizes of zero and a dropout outside `[0, 1]`, as PyTorch does.
    pub fn with_options(
        input_size: usize,
        hidden_size: usize,
        nonlinearity: RnnNonlinearity,
        options: RnnOptions,
        device: &Device,
    ) -> Result<RNN> {
        let cell = Cell::Rnn(nonlinearity);
        let r = Recurrent::sequence(cell, input_size, hidden_size, options, device)?;
        Ok(RNN(r))
    }

    /// The output sequence and the final `h_n` from the initial `h_0` (zeros
    /// when `None`).
    pub fn forward_state(&self, x: &Tensor, h0: Option<&Tensor>) -> Result<(Tensor, Tensor)> {
        let (out, h, _) = self.0.run(x, h0, None)?;
        Ok((out, h))
    }

    pub fn options(&self) -> RnnOptions {
        self.0.options
    }

    pub fn nonlinearity(&self) -> RnnNonlinearity {
        nonlinearity(&self.0)
    }
}

recurrent_module!(RNN);

/// The nonlinearity of an Elman layer's cell (what it was built with).
fn nonlinearity(r: &Recurrent) -> RnnNonlinearity {
    match r.cell {
        Cell::Rnn(n) => n,
        Cell::Lstm | Cell::Gru => RnnNonlinearity::default(),
    }
}

/// One Elman step (`nn.RNNCell`): parameters `weight_ih [H, input_size]`,
/// `weight_hh [H, H]`, `bias_ih [H]`, `bias_hh [H]`; input `[N, input_size]`
/// (or `[input_size]`), state `[N, H]` (or `[H]`).
pub struct RNNCell(Recurrent);

impl RNNCell {
    /// A tanh cell with biases (PyTorch's defaults).
    pub fn new(input_size: usize, hidden_size: usize, device: &Device) -> Result<RNNCell> {
        RNNCell::with_options(input_size, hidden_size, true, RnnNonlinearity::Tanh, device)
    }

    /// A tanh cell with or without biases.
    pub fn with_bias(
        input_size: usize,
        hidden_size: usize,
        bias: bool,
        device: &Device,
    ) -> Result<RNNCell> {
        RNNCell::with_options(input_size, hidden_size, bias, RnnNonlinearity::Tanh, device)
    }

    /// A cell of either nonlinearity; sizes of zero are accepted, as PyTorch's
    /// cells accept them.
    pub fn with_options(
        input_size: usize,
        hidden_size: usize,
        bias: bool,
        nonlinearity: RnnNonlinearity,
        device: &Device,
    ) -> Result<RNNCell> {
        let cell = Cell::Rnn(nonlinearity);
        let r = Recurrent::cell(cell, input_size, hidden_size, bias, device)?;
        Ok(RNNCell(r))
    }

    /// `h'` after one step from `h` (zeros when `None`).
    pub fn step(&self, x: &Tensor, h: Option<&Tensor>) -> Result<Tensor> {
        Ok(self.0.step_once(x, h, None)?.0)
    }

    pub fn nonlinearity(&self) -> RnnNonlinearity {
        nonlinearity(&self.0)
    }
}

recurrent_module!(RNNCell);
