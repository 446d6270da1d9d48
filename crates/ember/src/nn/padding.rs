//! The padding modules of `torch.nn` (`ZeroPad2d`, `ConstantPad1d`,
//! `ReflectionPad2d`, `ReplicationPad3d`, `CircularPad1d`, ...), each a
//! [`Tensor::pad`] of the last 1, 2 or 3 dims with its mode. Amounts are
//! PyTorch's: one for every side, or each side's with the last dim first
//! (`[left, right, top, bottom, front, back]`); a negative amount crops.
//!
//! ```
//! use ember::nn::{self, Module};
//! # use ember::{Device, DType, Tensor};
//! let x = Tensor::arange(0i64, 9, &Device::Cpu)?.reshape([1, 3, 3])?;
//! // a mirror image of two columns on the left, one row below
//! let y = nn::ReflectionPad2d::new([2, 0, 0, 1]).forward(&x)?;
//! assert_eq!(y.shape(), &[1, 4, 5]);
//! assert_eq!(y.to_vec::<i64>()?[..5], [2, 1, 0, 1, 2]);
//! # Ok::<(), ember::Error>(())
//! ```

use super::Module;
use crate::{
    error::{Error, Result},
    tensor::{PadMode, Tensor},
};

/// A padding's amounts, `N` of them (two per padded dim, last dim first): made
/// from one amount for every side, or from each side's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Padding<const N: usize>(pub [i64; N]);

macro_rules! padding_from {
    ($($t:ty),*) => {$(
        impl<const N: usize> From<$t> for Padding<N> {
            fn from(amount: $t) -> Self {
                Padding([amount as i64; N])
            }
        }
        impl<const N: usize> From<[$t; N]> for Padding<N> {
            fn from(sides: [$t; N]) -> Self {
                Padding(sides.map(|a| a as i64))
            }
        }
    )*};
}
padding_from!(i32, i64, usize);

/// PyTorch's circular padding modules check the rank themselves: `dims`
/// padded dims take `dims + 1` or `dims + 2` dims.
fn check_circular_rank(op: &'static str, x: &Tensor, dims: usize) -> Result<()> {
    if x.rank() == dims + 1 || x.rank() == dims + 2 {
        return Ok(());
    }
    Err(Error::invalid(
        op,
        format!(
            "expected {}D or {}D input (got {}D input)",
            dims + 1,
            dims + 2,
            x.rank()
        ),
    ))
}

macro_rules! pad_module {
    ($(#[$doc:meta])* $name:ident, $n:literal, $mode:expr, $check:expr) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub struct $name {
            /// The amounts, two per padded dim, last dim first.
            pub padding: [i64; $n],
        }

        impl $name {
            #[doc = concat!("The module padding by `padding`: one amount for every side, or `[i64; ", stringify!($n), "]`, each side's (`nn.", stringify!($name), "(padding)`).")]
            pub fn new(padding: impl Into<Padding<$n>>) -> $name {
                $name {
                    padding: padding.into().0,
                }
            }
        }

        impl Module for $name {
            fn forward(&self, x: &Tensor) -> Result<Tensor> {
                let check: fn(&Tensor) -> Result<()> = $check;
                check(x)?;
                x.pad(&self.padding, $mode)
            }
        }
    };
}

macro_rules! constant_pad_module {
    ($(#[$doc:meta])* $name:ident, $n:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq)]
        pub struct $name {
            /// The amounts, two per padded dim, last dim first.
            pub padding: [i64; $n],
            /// The value written into the border.
            pub value: f64,
        }

        impl $name {
            #[doc = concat!("The module padding by `padding` (one amount for every side, or `[i64; ", stringify!($n), "]`, each side's) with `value` (`nn.", stringify!($name), "(padding, value)`).")]
            pub fn new(padding: impl Into<Padding<$n>>, value: f64) -> $name {
                $name {
                    padding: padding.into().0,
                    value,
                }
            }
        }

        impl Module for $name {
            fn forward(&self, x: &Tensor) -> Result<Tensor> {
                x.pad(&self.padding, PadMode::Constant(self.value))
            }
        }
    };
}

pad_module!(/// Pads the last dim with zeros (`nn.ZeroPad1d`): any input of at least
    /// one dim.
    ZeroPad1d, 2, PadMode::Constant(0.0), |_| Ok(()));
pad_module!(/// Pads the last two dims with zeros (`nn.ZeroPad2d`): any input of at
    /// least two dims.
    ZeroPad2d, 4, PadMode::Constant(0.0), |_| Ok(()));
pad_module!(/// Pads the last three dims with zeros (`nn.ZeroPad3d`): any input of at
    /// least three dims.
    ZeroPad3d, 6, PadMode::Constant(0.0), |_| Ok(()));
constant_pad_module!(/// Pads the last dim with a constant (`nn.ConstantPad1d`): any input of at
    /// least one dim; an integer input takes the value truncated.
    ConstantPad1d, 2);
constant_pad_module!(/// Pads the last two dims with a constant (`nn.ConstantPad2d`).
    ConstantPad2d, 4);
constant_pad_module!(/// Pads the last three dims with a constant (`nn.ConstantPad3d`).
    ConstantPad3d, 6);
pad_module!(/// Pads the last dim of `[C, W]` or `[N, C, W]` with its mirror image
    /// without the edge element (`nn.ReflectionPad1d`); each amount must be
    /// less than the dim's size.
    ReflectionPad1d, 2, PadMode::Reflect, |_| Ok(()));
pad_module!(/// Pads the last two dims of `[C, H, W]` or `[N, C, H, W]` with their mirror
    /// image without the edge element (`nn.ReflectionPad2d`).
    ReflectionPad2d, 4, PadMode::Reflect, |_| Ok(()));
pad_module!(/// Pads the last three dims of `[C, D, H, W]` or `[N, C, D, H, W]` with
    /// their mirror image without the edge element (`nn.ReflectionPad3d`).
    ReflectionPad3d, 6, PadMode::Reflect, |_| Ok(()));
pad_module!(/// Pads the last dim of `[C, W]` or `[N, C, W]` with copies of the edge
    /// element (`nn.ReplicationPad1d`).
    ReplicationPad1d, 2, PadMode::Replicate, |_| Ok(()));
pad_module!(/// Pads the last two dims of `[C, H, W]` or `[N, C, H, W]` with copies of
    /// the edge elements (`nn.ReplicationPad2d`).
    ReplicationPad2d, 4, PadMode::Replicate, |_| Ok(()));
pad_module!(/// Pads the last three dims of `[C, D, H, W]` or `[N, C, D, H, W]` with
    /// copies of the edge elements (`nn.ReplicationPad3d`).
    ReplicationPad3d, 6, PadMode::Replicate, |_| Ok(()));
pad_module!(/// Pads the last dim of `[C, W]` or `[N, C, W]` with the other end's
    /// elements, as if the dim were a ring (`nn.CircularPad1d`); an amount may
    /// be at most the dim's size.
    CircularPad1d, 2, PadMode::Circular, |x| check_circular_rank("CircularPad1d", x, 1));
pad_module!(/// Pads the last two dims of `[C, H, W]` or `[N, C, H, W]` circularly
    /// (`nn.CircularPad2d`).
    CircularPad2d, 4, PadMode::Circular, |x| check_circular_rank("CircularPad2d", x, 2));
pad_module!(/// Pads the last three dims of `[C, D, H, W]` or `[N, C, D, H, W]`
    /// circularly (`nn.CircularPad3d`).
    CircularPad3d, 6, PadMode::Circular, |x| check_circular_rank("CircularPad3d", x, 3));
