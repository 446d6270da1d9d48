//! Reading a dtype's name (`"float32"`, `"torch.bfloat16"`, `"bf16"`): apart from
//! [`DType`] itself so that the error type, which names dtypes, sits between.

use super::DType;
use crate::error::{Error, Result};
use std::str::FromStr;

impl FromStr for DType {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let t = s.trim().trim_start_matches("torch.");
        Ok(match t {
            "float32" | "float" | "f32" => DType::F32,
            "float64" | "double" | "f64" => DType::F64,
            "float16" | "half" | "f16" => DType::F16,
            "bfloat16" | "bf16" => DType::BF16,
            "int64" | "long" | "i64" => DType::I64,
            "uint8" | "u8" => DType::U8,
            "bool" => DType::Bool,
            _ => {
                return Err(Error::ParseDType {
                    input: s.to_string(),
                })
            }
        })
    }
}
