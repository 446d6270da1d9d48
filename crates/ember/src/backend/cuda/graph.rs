//! CUDA graphs (`torch.cuda.CUDAGraph`): the GPU work of a piece of code,
//! captured once and replayed with one launch, so a step of many small kernels
//! pays the host's launch overhead once instead of once per kernel.
//!
//! A capture records what the closure queues on the GPU without running it. The
//! tensors the closure makes come from a memory pool of the graph's own: every
//! replay reads and writes the same addresses, so they are the graph's static
//! inputs and outputs. New data goes in by copying into the input tensors (made
//! before the capture) before a replay; results are read from the output tensors
//! after it. Only GPU work is captured: host code in the closure (a Rust `if`, a
//! learning rate read from a variable, a tensor replaced by another) ran once, at
//! the capture.
//!
//! ```no_run
//! # use ember::prelude::*;
//! use ember::cuda::Graph;
//! let dev = Device::Cuda(0);
//! let w = Tensor::randn([256, 256], &dev)?;
//! let x = Tensor::zeros([64, 256], DType::F32, &dev)?; // the static input
//! // warm up once outside the capture (kernels compiled, library handles made)
//! x.matmul(&w)?.relu()?;
//! let (graph, y) = Graph::capture(&dev, || x.matmul(&w)?.relu())?;
//! for step in 0..10 {
//!     x.copy_(&Tensor::full([64, 256], step as f64, DType::F32, &dev)?)?;
//!     graph.replay()?; // y now holds relu(x @ w) for this x
//!     println!("{}", y.sum_all()?);
//! }
//! # Ok::<(), ember::Error>(())
//! ```
//!
//! Random draws (`rand`, `randn`, dropout) are captured so that each replay draws
//! new numbers: before a replay the counters they use are reserved from the
//! generator, as the same draws made eagerly would reserve them, so a seeded run
//! draws the same numbers with or without a graph. The generator is the one the
//! draws were captured with: a [`Generator`](crate::Generator) whose
//! [`scope`](crate::Generator::scope) was open at the capture (each replay
//! advances it, and leaves the global one alone), else the global one.
//!
//! Inside a capture these are errors, naming what to do instead: copies from or
//! to the host (`Tensor::new`, `to_vec`, `item`, `randperm`), waits for the GPU
//! and replays of graphs, made by the capturing thread on any stream (PyTorch's
//! default capture mode); work queued on other streams, and a second capture on
//! the same GPU. Ops that build index, mask or range tensors (`arange`, `eye`,
//! `tril`, `flip`, `pad`, causal attention's mask) compute them on the device and
//! are captured. While a capture is under way the caching allocator
//! neither empties its cache nor looks at events (neither is allowed then): an
//! allocation that does not fit fails at once. A bad index found by a captured check is reported by
//! the first wait after the replay that found it, as outside graphs.

use super::device::{dev, with_current_stream, CudaDev, GraphCheck, GraphRandom};
use super::runtime::{RtGraph, StreamId};
use crate::{
    device::Device,
    error::{Error, Result},
};
use std::sync::Arc;

/// Captured GPU work, replayed with [`replay`](Graph::replay).
pub struct Graph {
    dev: Arc<CudaDev>,
    graph: Option<RtGraph>,
    pool: StreamId,
    checks: Vec<GraphCheck>,
    random: Vec<GraphRandom>,
}

impl Graph {
    /// Captures the GPU work that `f` queues on `device` (on a stream of the
    /// graph's own, made to start after the work queued so far on the calling
    /// thread's current stream) and returns the graph with `f`'s result, whose
    /// tensors the replays write. Nothing of it runs until the first replay.
    /// An error of `f`, or of the capture, ends the capture and is returned.
    pub fn capture<R>(device: &Device, f: impl FnOnce() -> Result<R>) -> Result<(Graph, R)> {
        let d = match device {
            Device::Cuda(i) => dev(*i)?,
            other => {
                return Err(Error::invalid(
                    "cuda::Graph",
                    format!("a CUDA graph needs a CUDA device (cuda:N), got {other}"),
                ))
            }
        };
        d.refuse_in_capture("capturing a graph", "graphs do not nest")?;
        let side = d.capture_stream()?;
        // the capture starts after what this thread queued so far
        let here = d.stream();
        let mut ready = d.rt().event_create(false)?;
        let waited = d
            .rt()
            .event_record(&mut ready, here)
            .and_then(|()| d.stream_wait(side, &ready));
        d.rt().event_destroy(ready);
        waited?;
        d.begin_capture(side)?;
        // the capture ends whatever `f` does, a panic included
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            with_current_stream(d.ordinal, side, f)
        }));
        let captured = d.end_capture();
        let out = match out {
            Ok(out) => out,
            Err(panic) => {
                if let Ok(c) = captured {
                    d.drop_graph(c.graph, c.pool, &c.checks, &c.random);
                }
                std::panic::resume_unwind(panic);
            }
        };
        match (out, captured) {
            (Ok(r), Ok(c)) => Ok((
                Graph {
                    dev: d,
                    graph: Some(c.graph),
                    pool: c.pool,
                    checks: c.checks,
                    random: c.random,
                },
                r,
            )),
            (Err(e), Ok(c)) => {
                d.drop_graph(c.graph, c.pool, &c.checks, &c.random);
                Err(e)
            }
            // `f`'s error first: the capture usually failed because of it
            (Err(e), Err(_)) => Err(e),
            (Ok(_), Err(e)) => Err(e),
        }
    }

    /// Queues the captured work on the calling thread's current stream of the
    /// graph's device (`CUDAGraph.replay()`); returns without waiting.
    pub fn replay(&self) -> Result<()> {
        let g = self
            .graph
            .as_ref()
            .expect("a graph is destroyed only by drop");
        self.dev.launch_graph(g, &self.checks, &self.random)
    }

    /// The device the graph runs on.
    pub fn device(&self) -> Device {
        self.dev.device()
    }
}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Graph({})", self.dev.device())
    }
}

impl Drop for Graph {
    /// Waits for the graph's replays, then frees its memory pool (tensors of it
    /// still held stay valid).
    fn drop(&mut self) {
        if let Some(g) = self.graph.take() {
            self.dev
                .drop_graph(g, self.pool, &self.checks, &self.random);
        }
    }
}
