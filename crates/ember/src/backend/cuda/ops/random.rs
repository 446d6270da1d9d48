//! Kernels of `kernels/random.cu`: uniform and normal draws from the Philox
//! stream.

use super::{launch_n, new_out, suffix};
use crate::backend::cuda::{CudaDev, CudaStorage};
use crate::{dtype::DType, error::Result};
use std::ffi::c_void;
use std::sync::Arc;

/// `n` random values of the float `dtype` drawn on the device from the global
/// Philox stream: uniform in `[p0, p1)`, or normal with mean `p0` and standard
/// deviation `p1` when `normal`.
pub(crate) fn random(
    dev: &Arc<CudaDev>,
    dtype: DType,
    n: usize,
    normal: bool,
    p0: f64,
    p1: f64,
) -> Result<CudaStorage> {
    let out = new_out(dev, dtype, n)?;
    let per = if dtype == DType::F64 { 2 } else { 4 };
    let counters = n.div_ceil(per);
    let (po, n64, nrm) = (out.ptr(), n as i64, normal as i32);
    // inside a capture the seed and first counter are read at each replay from
    // device words (`a`), the draw placed `b` counters after that counter
    let (kernel, a, b) = match dev.graph_random(counters as u64)? {
        Some((state, intra)) => ("random_graph", state, intra),
        None => {
            let (seed, offset) = crate::backend::cuda::random::reserve_counters(counters as u64)?;
            ("random", seed, offset)
        }
    };
    let name = format!("{kernel}_{}", suffix(dtype));
    launch_n(
        dev,
        "random",
        dtype,
        &name,
        counters,
        &mut args![po, n64, a, b, nrm, p0, p1],
    )?;
    Ok(out)
}

/// `n` integers drawn uniformly from `[low, low + span)` (int64, wrapping) on
/// the device from the Philox stream, two per counter.
pub(crate) fn randint(dev: &Arc<CudaDev>, n: usize, low: i64, span: u64) -> Result<CudaStorage> {
    let out = new_out(dev, DType::I64, n)?;
    let counters = n.div_ceil(2) as u64;
    let (po, n64) = (out.ptr(), n as i64);
    let (kernel, a, b) = match dev.graph_random(counters)? {
        Some((state, intra)) => ("randint_graph_i64", state, intra),
        None => {
            let (seed, offset) = crate::backend::cuda::random::reserve_counters(counters)?;
            ("randint_i64", seed, offset)
        }
    };
    launch_n(
        dev,
        "random",
        DType::I64,
        kernel,
        counters as usize,
        &mut args![po, n64, a, b, low, span],
    )?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::ops::{launch_kernel, THREADS};

    /// Philox4x32-10 on a full 128-bit counter and 64-bit key: the reference for
    /// kernels/random.cu.
    fn philox4x32_10(mut c: [u32; 4], mut k: [u32; 2]) -> [u32; 4] {
        let mulhilo = |a: u32, b: u32| {
            let p = a as u64 * b as u64;
            ((p >> 32) as u32, p as u32)
        };
        for _ in 0..10 {
            let (h0, l0) = mulhilo(0xD251_1F53, c[0]);
            let (h1, l1) = mulhilo(0xCD9E_8D57, c[2]);
            c = [h1 ^ c[1] ^ k[0], l1, h0 ^ c[3] ^ k[1], l0];
            k = [
                k[0].wrapping_add(0x9E37_79B9),
                k[1].wrapping_add(0xBB67_AE85),
            ];
        }
        c
    }

    /// The known-answer vectors published with Random123 (kat_vectors).
    #[test]
    fn philox_reference_matches_the_published_vectors() {
        assert_eq!(
            philox4x32_10([0; 4], [0; 2]),
            [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]
        );
        assert_eq!(
            philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]
        );
        assert_eq!(
            philox4x32_10(
                [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
                [0xa4093822, 0x299f31d0]
            ),
            [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
        );
    }

    /// The device generator gives the reference's words, and its uniform floats are
    /// the words' top 24 bits (on a GPU or the simulator; skipped without either).
    #[test]
    fn device_philox_matches_the_reference() {
        if let Some(reason) = crate::backend::cuda::discover::unavailable_reason() {
            eprintln!("skipped: {reason}");
            return;
        }
        let dev = crate::backend::cuda::dev(0).unwrap();
        let counters = 1000usize;
        let (seed, offset) = (0x0123_4567_89ab_cdefu64, (1u64 << 32) - 3);
        let out = new_out(&dev, DType::I64, counters * 2).unwrap(); // 4 u32 per counter
        let (po, c64) = (out.ptr(), counters as i64);
        let mut p = args![po, c64, seed, offset];
        let name = ("random", DType::F32, "philox_raw");
        launch_kernel(&dev, name, (4, 1, 1), ((THREADS, 1, 1), 0), &mut p).unwrap();
        let words: Vec<u32> = match out.to_cpu().unwrap() {
            crate::dtype::CpuData::I64(v) => v
                .iter()
                .flat_map(|&x| [x as u64 as u32, (x as u64 >> 32) as u32])
                .collect(),
            _ => unreachable!(),
        };
        for c in 0..counters {
            let ctr = offset + c as u64;
            let want = philox4x32_10(
                [ctr as u32, (ctr >> 32) as u32, 0, 0],
                [seed as u32, (seed >> 32) as u32],
            );
            assert_eq!(&words[4 * c..4 * c + 4], &want, "counter {ctr}");
        }
    }
}
