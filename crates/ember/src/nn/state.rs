//! Loading a state dict into a module: PyTorch's `load_state_dict`, strict or
//! not, checked whole before anything is copied.

use super::Module;
use crate::{
    error::{Error, Result},
    tensor::Tensor,
};
use std::collections::{HashMap, HashSet};

/// The keys [`Module::load_state_dict`] could not match (PyTorch's
/// `_IncompatibleKeys`): the model's entries the state lacked, and the state's
/// entries the model does not have. Both empty after a strict load.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IncompatibleKeys {
    pub missing_keys: Vec<String>,
    pub unexpected_keys: Vec<String>,
}

impl IncompatibleKeys {
    /// Whether every key matched.
    pub fn is_empty(&self) -> bool {
        self.missing_keys.is_empty() && self.unexpected_keys.is_empty()
    }
}

/// Copies the entries of `state` whose names the model has into its parameters
/// and buffers (converted to each one's dtype and moved to its device). With
/// `strict`, a missing or unexpected key is an error; in any mode so is a shape
/// that differs. Every check, and every move and conversion, runs before the
/// first copy: on an error the model is unchanged. `what` names the state in
/// errors (a file, "the state dict").
pub(crate) fn load_state<M: Module + ?Sized>(
    model: &M,
    state: &[(String, Tensor)],
    strict: bool,
    what: &str,
) -> Result<IncompatibleKeys> {
    let shapes: Vec<(&str, &[usize])> =
        state.iter().map(|(n, t)| (n.as_str(), t.shape())).collect();
    model.materialize_lazy(&shapes)?;
    let params = model.state_dict();
    let report = check_state(&params, &shapes, strict, what)?;
    // a name given twice: the later entry wins, as in a Python dict
    let given: HashMap<&str, &Tensor> = state.iter().map(|(n, t)| (n.as_str(), t)).collect();
    // every entry moved and converted before the first copy, so that a failure
    // (out of memory on the device) leaves the model as it was
    let pairs = crate::autograd::no_grad(|| {
        params
            .iter()
            .filter_map(|(n, p)| given.get(n.as_str()).map(|t| (p, *t)))
            .map(|(p, t)| {
                let t = if t.device() == p.device() {
                    t.clone()
                } else {
                    t.to(&p.device())?
                };
                let t = if t.dtype() == p.dtype() {
                    t
                } else {
                    t.to_dtype(p.dtype())?
                };
                Ok((p, t))
            })
            .collect::<Result<Vec<_>>>()
    })?;
    crate::autograd::no_grad(|| pairs.iter().try_for_each(|(p, t)| p.copy_(t)))?;
    Ok(report)
}

/// Checks the names and shapes of a state (`given`, in its order) against a
/// model's state dict (`params`), as [`load_state`] does before it copies: the
/// report of missing and unexpected keys, or the error `load_state` would give.
pub(crate) fn check_state(
    params: &[(String, Tensor)],
    given: &[(&str, &[usize])],
    strict: bool,
    what: &str,
) -> Result<IncompatibleKeys> {
    // a name given twice: the later entry wins, as in a Python dict
    let shapes: HashMap<&str, &[usize]> = given.iter().copied().collect();
    let want: HashSet<&str> = params.iter().map(|(n, _)| n.as_str()).collect();
    // batch norm's `num_batches_tracked` (PyTorch's state version 2) may be
    // absent, as in states saved before it existed: the model keeps its own,
    // as PyTorch's batch norm fills it in when loading such a state
    let optional = |n: &str| n == "num_batches_tracked" || n.ends_with(".num_batches_tracked");
    let missing: Vec<String> = params
        .iter()
        .filter(|(n, _)| !shapes.contains_key(n.as_str()) && !optional(n))
        .map(|(n, _)| n.clone())
        .collect();
    let mut unexpected: Vec<String> = Vec::new();
    let mut listed = HashSet::new();
    for (n, _) in given {
        if !want.contains(n) && listed.insert(*n) {
            unexpected.push(n.to_string());
        }
    }
    let report = IncompatibleKeys {
        missing_keys: missing,
        unexpected_keys: unexpected,
    };
    let mut errors = Vec::new();
    if strict && !report.is_empty() {
        let list = |keys: &[String]| {
            keys.iter()
                .map(|k| format!("{k:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        if !report.missing_keys.is_empty() {
            errors.push(format!("missing keys: {}", list(&report.missing_keys)));
        }
        if !report.unexpected_keys.is_empty() {
            errors.push(format!(
                "unexpected keys: {}",
                list(&report.unexpected_keys)
            ));
        }
        if let Some(hint) = prefix_hint(&report) {
            errors.push(hint);
        }
    }
    let mut first_mismatch = None;
    for (name, p) in params {
        let Some(&shape) = shapes.get(name.as_str()) else {
            continue;
        };
        if shape != p.shape() {
            errors.push(format!(
                "size mismatch for {name}: copying a tensor of shape {shape:?} from {what}, the \
                 shape in the model is {:?}",
                p.shape()
            ));
            first_mismatch.get_or_insert((p.shape().to_vec(), shape.to_vec()));
        }
    }
    if !errors.is_empty() {
        let msg = format!("{what} does not match the model: {}", errors.join("; "));
        let keys_wrong = strict && !report.is_empty();
        return Err(match first_mismatch {
            Some((model, given)) if !keys_wrong => {
                Error::shape("load_state_dict", &model, &given, msg)
            }
            _ => Error::invalid("load_state_dict", msg),
        });
    }
    Ok(report)
}

/// When every missing key is an unexpected key with a prefix added or taken
/// away (`module.` from DataParallel, `model.` from a checkpoint), says so.
fn prefix_hint(r: &IncompatibleKeys) -> Option<String> {
    let (m, u) = (r.missing_keys.first()?, r.unexpected_keys.first()?);
    if let Some(prefix) = u.strip_suffix(m.as_str()).filter(|p| p.ends_with('.')) {
        if r.missing_keys
            .iter()
            .all(|k| r.unexpected_keys.contains(&format!("{prefix}{k}")))
        {
            return Some(format!(
                "the state's names carry a prefix {prefix:?} the model's do not: take it off \
                 (for a checkpoint, select its part, e.g. PtFile::select or --key)"
            ));
        }
    }
    if let Some(prefix) = m.strip_suffix(u.as_str()).filter(|p| p.ends_with('.')) {
        if r.unexpected_keys
            .iter()
            .all(|k| r.missing_keys.contains(&format!("{prefix}{k}")))
        {
            return Some(format!(
                "the model's names carry a prefix {prefix:?} the state's do not"
            ));
        }
    }
    None
}
