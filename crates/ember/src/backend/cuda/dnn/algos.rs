//! Choosing a cuDNN algorithm for a pass: cuDNN's heuristic ranking
//! (`cudnnGet*Algorithm_v7`) or its timed search (`cudnnFind*AlgorithmEx`), read
//! into [`Choice`]s without trusting values a newer cuDNN may report.

use super::{dnn_err, Descriptors};
use crate::backend::cuda::calls::{ConvCall, ConvPass};
use crate::error::Result;
use cudarc::cudnn::{result as dnn, sys};
use std::ffi::c_void;

/// An algorithm of one of the three passes.
#[derive(Clone, Copy, Debug)]
pub(super) enum Algo {
    Forward(sys::cudnnConvolutionFwdAlgo_t),
    BackwardData(sys::cudnnConvolutionBwdDataAlgo_t),
    BackwardFilter(sys::cudnnConvolutionBwdFilterAlgo_t),
}

/// The most algorithms cuDNN reports for any pass.
const MAX_ALGOS: usize = 8;

/// One entry of cuDNN's heuristic answer. The three passes' perf structs share this
/// layout; it is read as plain integers because a newer cuDNN may report values
/// that the bindings' enums do not list.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct RawPerf {
    algo: u32,
    status: u32,
    time: f32,
    memory: usize,
    determinism: u32,
    math_type: u32,
    reserved: [i32; 3],
}

const _: () = {
    use std::mem::{align_of, size_of};
    assert!(size_of::<RawPerf>() == size_of::<sys::cudnnConvolutionFwdAlgoPerf_t>());
    assert!(size_of::<RawPerf>() == size_of::<sys::cudnnConvolutionBwdDataAlgoPerf_t>());
    assert!(size_of::<RawPerf>() == size_of::<sys::cudnnConvolutionBwdFilterAlgoPerf_t>());
    assert!(align_of::<RawPerf>() == align_of::<sys::cudnnConvolutionFwdAlgoPerf_t>());
};

/// A way to run a pass: the algorithm, the math type it was ranked with, and its
/// workspace size (the heuristic's estimate until [`sized`] asks cuDNN for this
/// algorithm's own).
#[derive(Clone, Copy, Debug)]
pub(super) struct Choice {
    pub algo: Algo,
    pub math: sys::cudnnMathType_t,
    pub bytes: usize,
}

/// `choice` with the workspace cuDNN says its algorithm needs for `d` under its
/// math type (`cudnnGetConvolution*WorkspaceSize`), which may differ from the
/// heuristic's figure.
///
/// # Safety
/// `h` is a live handle and `d` describes the call.
pub(super) unsafe fn sized(
    h: sys::cudnnHandle_t,
    d: &Descriptors,
    choice: Choice,
) -> Result<Choice> {
    dnn::set_convolution_math_type(d.conv, choice.math)
        .map_err(dnn_err("cudnnSetConvolutionMathType"))?;
    let bytes = match choice.algo {
        Algo::Forward(a) => {
            dnn::get_convolution_forward_workspace_size(h, d.x, d.w, d.conv, d.y, a)
                .map_err(dnn_err("cudnnGetConvolutionForwardWorkspaceSize"))?
        }
        Algo::BackwardData(a) => {
            dnn::get_convolution_backward_data_workspace_size(h, d.w, d.y, d.conv, d.x, a)
                .map_err(dnn_err("cudnnGetConvolutionBackwardDataWorkspaceSize"))?
        }
        Algo::BackwardFilter(a) => {
            dnn::get_convolution_backward_filter_workspace_size(h, d.x, d.y, d.conv, d.w, a)
                .map_err(dnn_err("cudnnGetConvolutionBackwardFilterWorkspaceSize"))?
        }
    };
    Ok(Choice { bytes, ..choice })
}

impl Choice {
    /// The usable choice `p` describes for `pass`, if cuDNN reported success for it
    /// with values ember knows.
    /// With `deterministic`, only an algorithm cuDNN reports as deterministic.
    fn from_perf(
        p: &RawPerf,
        pass: ConvPass,
        math_rule: Option<sys::cudnnMathType_t>,
        deterministic: bool,
    ) -> Option<Choice> {
        use sys::cudnnMathType_t::*;
        if p.status != sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS as u32 {
            return None;
        }
        if deterministic && p.determinism != sys::cudnnDeterminism_t::CUDNN_DETERMINISTIC as u32 {
            return None;
        }
        let math = match p.math_type {
            0 => CUDNN_DEFAULT_MATH,
            1 => CUDNN_TENSOR_OP_MATH,
            2 => CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION,
            3 => CUDNN_FMA_MATH,
            _ => return None,
        };
        // SAFETY (each transmute): a value below the enum's COUNT is one of its
        // variants (the enums are #[repr(u32)] and dense from 0).
        let algo = unsafe {
            match pass {
                ConvPass::Forward if p.algo < 8 => Algo::Forward(std::mem::transmute::<
                    u32,
                    sys::cudnnConvolutionFwdAlgo_t,
                >(p.algo)),
                ConvPass::BackwardData if p.algo < 6 => {
                    Algo::BackwardData(
                        std::mem::transmute::<u32, sys::cudnnConvolutionBwdDataAlgo_t>(p.algo),
                    )
                }
                ConvPass::BackwardFilter if p.algo < 7 => {
                    Algo::BackwardFilter(std::mem::transmute::<
                        u32,
                        sys::cudnnConvolutionBwdFilterAlgo_t,
                    >(p.algo))
                }
                _ => return None,
            }
        };
        Some(Choice {
            algo,
            math: math_rule.unwrap_or(math),
            bytes: p.memory,
        })
    }
}

/// cuDNN's heuristic choices for a pass, best first, those it reports as usable.
///
/// # Safety
/// `h` is a live handle and `d` describes the call.
pub(super) unsafe fn ranked(
    h: sys::cudnnHandle_t,
    d: &Descriptors,
    pass: ConvPass,
    math_rule: Option<sys::cudnnMathType_t>,
    deterministic: bool,
) -> Result<Vec<Choice>> {
    let mut perf = [RawPerf::default(); MAX_ALGOS];
    let mut count = 0i32;
    let (n, out) = (MAX_ALGOS as i32, perf.as_mut_ptr());
    // SAFETY: `out` has room for MAX_ALGOS entries of the perf structs' layout.
    match pass {
        ConvPass::Forward => dnn::get_convolution_forward_algorithm(
            h,
            d.x,
            d.w,
            d.conv,
            d.y,
            n,
            &mut count,
            out.cast(),
        )
        .map_err(dnn_err("cudnnGetConvolutionForwardAlgorithm_v7"))?,
        ConvPass::BackwardData => dnn::get_convolution_backward_data_algorithm(
            h,
            d.w,
            d.y,
            d.conv,
            d.x,
            n,
            &mut count,
            out.cast(),
        )
        .map_err(dnn_err("cudnnGetConvolutionBackwardDataAlgorithm_v7"))?,
        ConvPass::BackwardFilter => dnn::get_convolution_backward_filter_algorithm(
            h,
            d.x,
            d.y,
            d.conv,
            d.w,
            n,
            &mut count,
            out.cast(),
        )
        .map_err(dnn_err("cudnnGetConvolutionBackwardFilterAlgorithm_v7"))?,
    }
    Ok(perf[..count.clamp(0, n) as usize]
        .iter()
        .filter_map(|p| Choice::from_perf(p, pass, math_rule, deterministic))
        .collect())
}

/// cuDNN's algorithms for `c`'s pass timed on `c`'s own arrays
/// (`cudnnFind*AlgorithmEx`: each is run, the output overwritten), fastest first,
/// those that ran within `c`'s workspace. Waits for the GPU.
///
/// # Safety
/// `h` is a live handle bound to the call's stream, `d` describes `c`, whose
/// pointers address its arrays and workspace.
pub(super) unsafe fn found(
    h: sys::cudnnHandle_t,
    d: &Descriptors,
    c: &ConvCall,
    math_rule: Option<sys::cudnnMathType_t>,
    deterministic: bool,
) -> Result<Vec<Choice>> {
    let mut perf = [RawPerf::default(); MAX_ALGOS];
    let mut count = 0i32;
    let (n, out) = (MAX_ALGOS as i32, perf.as_mut_ptr());
    let (x, w, y) = (c.x as *mut c_void, c.w as *mut c_void, c.y as *mut c_void);
    let (ws, bytes) = (c.workspace as *mut c_void, c.workspace_bytes);
    // SAFETY: `out` has room for MAX_ALGOS entries of the perf structs' layout; the
    // arrays and the workspace are the call's.
    let (status, op) = match c.pass {
        ConvPass::Forward => (
            sys::cudnnFindConvolutionForwardAlgorithmEx(
                h,
                d.x,
                x,
                d.w,
                w,
                d.conv,
                d.y,
                y,
                n,
                &mut count,
                out.cast(),
                ws,
                bytes,
            ),
            "cudnnFindConvolutionForwardAlgorithmEx",
        ),
        ConvPass::BackwardData => (
            sys::cudnnFindConvolutionBackwardDataAlgorithmEx(
                h,
                d.w,
                w,
                d.y,
                y,
                d.conv,
                d.x,
                x,
                n,
                &mut count,
                out.cast(),
                ws,
                bytes,
            ),
            "cudnnFindConvolutionBackwardDataAlgorithmEx",
        ),
        ConvPass::BackwardFilter => (
            sys::cudnnFindConvolutionBackwardFilterAlgorithmEx(
                h,
                d.x,
                x,
                d.y,
                y,
                d.conv,
                d.w,
                w,
                n,
                &mut count,
                out.cast(),
                ws,
                bytes,
            ),
            "cudnnFindConvolutionBackwardFilterAlgorithmEx",
        ),
    };
    status.result().map_err(dnn_err(op))?;
    Ok(perf[..count.clamp(0, n) as usize]
        .iter()
        .filter_map(|p| Choice::from_perf(p, c.pass, math_rule, deterministic))
        .filter(|choice| choice.bytes <= bytes)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heuristic_entries_are_read_without_trusting_their_values() {
        use sys::cudnnMathType_t::*;
        let ok = sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS as u32;
        let perf = |algo, status, math_type| RawPerf {
            algo,
            status,
            memory: 1 << 20,
            math_type,
            ..RawPerf::default()
        };
        let take = |p: &RawPerf, pass, rule| Choice::from_perf(p, pass, rule, false);
        let c = take(&perf(6, ok, 1), ConvPass::Forward, None).unwrap();
        assert!(matches!(
            c.algo,
            Algo::Forward(sys::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD)
        ));
        assert_eq!((c.math, c.bytes), (CUDNN_TENSOR_OP_MATH, 1 << 20));
        // f32 without TF32 keeps FMA whatever the entry says
        let c = take(
            &perf(1, ok, 0),
            ConvPass::BackwardData,
            Some(CUDNN_FMA_MATH),
        );
        assert_eq!(c.unwrap().math, CUDNN_FMA_MATH);
        // failed entries, and algorithms or math types past what ember knows
        let not_supported = sys::cudnnStatus_t::CUDNN_STATUS_NOT_SUPPORTED as u32;
        assert!(take(&perf(0, not_supported, 0), ConvPass::Forward, None).is_none());
        assert!(take(&perf(8, ok, 0), ConvPass::Forward, None).is_none());
        assert!(take(&perf(6, ok, 0), ConvPass::BackwardData, None).is_none());
        assert!(take(&perf(6, ok, 0), ConvPass::BackwardFilter, None).is_some());
        assert!(take(&perf(7, ok, 0), ConvPass::BackwardFilter, None).is_none());
        assert!(take(&perf(0, 9999, 0), ConvPass::Forward, None).is_none());
        assert!(take(&perf(0, ok, 4), ConvPass::Forward, None).is_none());
        // deterministic: only what cuDNN reports as CUDNN_DETERMINISTIC (1)
        let det = |determinism| RawPerf {
            determinism,
            ..perf(1, ok, 0)
        };
        let strict = |p: &RawPerf| Choice::from_perf(p, ConvPass::BackwardFilter, None, true);
        assert!(strict(&det(0)).is_none());
        assert!(strict(&det(1)).is_some());
        assert!(strict(&det(7)).is_none());
        assert!(take(&det(0), ConvPass::BackwardFilter, None).is_some());
    }
}
