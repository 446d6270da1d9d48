//! # ember
//!
//! GPU-accelerated tensors and deep learning with PyTorch's device model, in Rust.
//!
//! Every [`Tensor`] lives on a [`Device`] (`cpu`, `cuda:0`, ...). Operations follow
//! PyTorch's semantics (broadcasting, type promotion, `torch.matmul` rules) and
//! return [`Result`]: bad shapes, mixed devices and a missing GPU are errors, never
//! panics.
//!
//! ```
//! use ember::prelude::*;
//!
//! // PyTorch's `device = "cuda:0" if torch.cuda.is_available() else "cpu"`
//! let device = Device::cuda_if_available(0);
//! ember::manual_seed(0);
//! let x = Tensor::randn([64, 3], &device)?;
//! let w = Tensor::randn([3, 2], &device)?;
//! let y = x.matmul(&w)?.relu()?.softmax(-1)?;
//! assert_eq!(y.shape(), &[64, 2]);
//! let total = y.sum_all()?.item::<f32>()?;
//! assert!((total - 64.0).abs() < 1e-3);
//! # Ok::<(), ember::Error>(())
//! ```

pub mod autograd;
mod backend;
pub mod data;
pub mod device;
pub mod distributed;
mod dtype;
mod error;
mod files;
pub mod io;
pub mod kernel;
pub mod layout;
pub mod linalg;
pub mod memory;
pub mod models;
pub mod nn;
pub mod optim;
pub mod profiler;
mod tensor;
pub mod train;

pub use amp::{autocast, autocast_guard};
pub use autograd::{enable_grad, enable_grad_guard, is_grad_enabled, no_grad, no_grad_guard};
pub use backend::generator::Generator;
pub use device::Device;
pub use dtype::{DType, FloatDType, WithDType};
pub use error::{Error, Result};
pub use layout::MemoryFormat;
pub use tensor::Sections;
pub use tensor::{
    initial_seed, manual_seed, set_print_options, with_global_rng, Conv2dOptions, Conv3dOptions,
    Idx, IndexArg, IntoDims, IntoShape, IntoTensorIndex, NdArray, Operand, PadMode, Pool2dOptions,
    PrintOptions, Scalar, Tensor, TensorIndex,
};

pub mod amp {
    //! Automatic mixed precision (`torch.amp`): `torch.autocast`, and the loss
    //! scaler [`GradScaler`] for float16.
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
    //!   `bce_with_logits`, `l1_loss`, `smooth_l1_loss`, `huber_loss`, `kl_div`,
    //!   and on the CPU `binary_cross_entropy`, which CUDA's autocast refuses as
    //!   PyTorch's does), and on CUDA also `softmax`, `log_softmax` and
    //!   `layer_norm`, as PyTorch's CUDA list has them (its CPU list leaves them in
    //!   the input's dtype, and so does ember's CPU), and on the CPU reflection
    //!   and replication padding (`pad`), as PyTorch's CPU list has them;
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
    //!

    pub use crate::optim::GradScaler;
    pub use crate::tensor::autocast::{
        autocast, autocast_dtype, autocast_guard, autocast_guard_for, is_autocast_enabled,
        AutocastGuard, DeviceType,
    };
}

/// CUDA devices: discovery and properties, streams, graphs, synchronization,
/// events, memory statistics of the caching allocator (`torch.cuda`).
pub mod cuda {
    pub use crate::backend::cuda::discover::*;
    pub use crate::backend::cuda::libs::{
        ensure as find_library, include_dirs, CudaLib, LibSource,
    };
    pub use crate::backend::cuda::pinned::set_pinned_staging;
    pub use crate::backend::cuda::{
        allow_tf32, bias_epilogue_products, empty_cache, host_memory_stats, host_syncs,
        max_memory_allocated, mem_get_info, memory_allocated, memory_reserved, memory_stats,
        reset_peak_memory_stats, set_allow_tf32, synchronize, Event, HostMemoryStats, MemoryStats,
    };
    pub use crate::backend::cuda::{current_stream, default_stream, with_stream, Graph, Stream};

    /// Convolutions through NVIDIA's cuDNN (`torch.backends.cudnn`): on by default
    /// where the library is found; `set_enabled(false)` or `EMBER_CUDNN=0` sends
    /// them to ember's own im2col path. `set_benchmark(true)` times cuDNN's
    /// algorithms once per shape (`torch.backends.cudnn.benchmark`),
    /// `set_deterministic(true)` keeps to its deterministic ones
    /// (`torch.backends.cudnn.deterministic`).
    pub mod cudnn {
        pub use crate::backend::cuda::cudnn::{
            allow_tf32, attention, attention_passes, benchmark, channels_last_convolutions,
            convolutions, deterministic, enabled, graph_api, graph_convolutions, in_use,
            is_available, set_allow_tf32, set_attention, set_benchmark, set_deterministic,
            set_enabled, set_graph_api, set_workspace_limit, unavailable_reason, version,
            workspace_limit,
        };
    }
}

/// The `meta` device's accounting: a hook that sees every meta allocation and free,
/// with the training phase and the module that asked (what an estimate of a
/// step's memory needs). See [`Device::Meta`].
pub mod meta {
    pub use crate::backend::meta::account::*;
}

/// Host-side memory management (the pool of freed CPU buffers).
pub mod cpu {
    pub use crate::backend::cpu::info::{cpu_info, init_threads, CpuInfo};
    pub use crate::backend::host::{empty_cache, pool_stats, set_pool_limit, CpuPoolStats};
}

/// The names most programs need: `use ember::prelude::*;`.
pub mod prelude {
    pub use crate::nn::Module;
    pub use crate::optim::Optimizer;
    pub use crate::{
        Conv2dOptions, Conv3dOptions, DType, Device, Error, IndexArg, Pool2dOptions, Result,
        Tensor, TensorIndex,
    };
}

// Compile and run the README's examples as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;
