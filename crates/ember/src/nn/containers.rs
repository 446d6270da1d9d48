//! `nn.ModuleList` and `nn.ModuleDict`: children held for their parameters,
//! buffers, device moves and train/eval switches, called by the user's own
//! forward code (neither has a forward of its own, as in PyTorch).

use super::Module;
use crate::{
    device::Device,
    dtype::DType,
    error::{Error, Result},
    tensor::Tensor,
};

/// The `Module` methods that visit `self.children()` (all but `forward`).
macro_rules! container_methods {
    () => {
        fn named_parameters(&self) -> Vec<(String, Tensor)> {
            self.visit(|m| m.named_parameters())
        }
        fn named_buffers(&self) -> Vec<(String, Tensor)> {
            self.visit(|m| m.named_buffers())
        }
        fn materialize_lazy(&self, shapes: &[(&str, &[usize])]) -> Result<()> {
            super::materialize_children(self.named(), shapes)
        }
        fn to_device(&mut self, device: &Device) -> Result<()> {
            super::to_device_all(self.modules_mut(), device)
        }
        fn to_empty(&mut self, device: &Device) -> Result<()> {
            let shared = super::shared_in(&*self);
            super::converting(shared, || self.each_mut(|m| m.to_empty(device)))
        }
        fn to_dtype(&mut self, dtype: DType) -> Result<()> {
            super::to_dtype_all(self.modules_mut(), dtype)
        }
        fn reset_parameters(&mut self) -> Result<()> {
            self.each_mut(|m| m.reset_parameters())
        }
        fn to_memory_format(&mut self, format: crate::layout::MemoryFormat) -> Result<()> {
            let shared = super::shared_in(&*self);
            super::converting(shared, || self.each_mut(|m| m.to_memory_format(format)))
        }
        fn set_training(&mut self, training: bool) {
            let _ = self.each_mut(|m| {
                m.set_training(training);
                Ok(())
            });
        }
    };
}

/// Modules in a list (`nn.ModuleList`): their parameters are named `"0.weight"`,
/// `"1.bias"`, ...; index them to call them (`layers[i].forward(&x)`).
#[derive(Default)]
pub struct ModuleList {
    modules: Vec<Box<dyn Module>>,
}

impl ModuleList {
    pub fn new() -> ModuleList {
        ModuleList::default()
    }

    /// Appends a module (`append`).
    pub fn push(&mut self, m: impl Module + 'static) {
        self.modules.push(Box::new(m));
    }

    pub fn len(&self) -> usize {
        self.modules.len()
    }

    pub fn is_empty(&self) -> bool {
        self.modules.is_empty()
    }

    pub fn get(&self, i: usize) -> Option<&dyn Module> {
        self.modules.get(i).map(|m| m.as_ref())
    }

    pub fn iter(&self) -> impl Iterator<Item = &dyn Module> + '_ {
        self.modules.iter().map(|m| m.as_ref())
    }

    fn named(&self) -> Vec<(String, &dyn Module)> {
        let each = self.modules.iter().enumerate();
        each.map(|(i, m)| (i.to_string(), m.as_ref())).collect()
    }

    fn visit(&self, f: impl Fn(&dyn Module) -> Vec<(String, Tensor)>) -> Vec<(String, Tensor)> {
        self.modules
            .iter()
            .enumerate()
            .flat_map(|(i, m)| {
                f(m.as_ref())
                    .into_iter()
                    .map(move |(n, t)| (format!("{i}.{n}"), t))
            })
            .collect()
    }

    fn each_mut(&mut self, f: impl Fn(&mut dyn Module) -> Result<()>) -> Result<()> {
        self.modules.iter_mut().try_for_each(|m| f(m.as_mut()))
    }

    fn modules_mut(&mut self) -> Vec<&mut dyn Module> {
        self.modules
            .iter_mut()
            .map(|m| m.as_mut() as &mut dyn Module)
            .collect()
    }
}

impl<M: Module + 'static> FromIterator<M> for ModuleList {
    fn from_iter<I: IntoIterator<Item = M>>(iter: I) -> Self {
        ModuleList {
            modules: iter
                .into_iter()
                .map(|m| Box::new(m) as Box<dyn Module>)
                .collect(),
        }
    }
}

impl std::ops::Index<usize> for ModuleList {
    type Output = dyn Module;
    fn index(&self, i: usize) -> &(dyn Module + 'static) {
        self.modules[i].as_ref()
    }
}

impl Module for ModuleList {
    /// A list has no forward of its own (PyTorch raises too): call its modules.
    fn forward(&self, _x: &Tensor) -> Result<Tensor> {
        Err(Error::invalid(
            "ModuleList",
            "a ModuleList has no forward: call its modules (list[i].forward(x))",
        ))
    }
    container_methods!();
}

/// Modules by name (`nn.ModuleDict`), in insertion order: parameters are named
/// `"<name>.weight"`.
#[derive(Default)]
pub struct ModuleDict {
    modules: Vec<(String, Box<dyn Module>)>,
}

impl ModuleDict {
    pub fn new() -> ModuleDict {
        ModuleDict::default()
    }

    /// Adds or replaces the module `name` (`dict[name] = m`); a name must be
    /// non-empty and without `.` (the separator of parameter paths).
    pub fn insert(&mut self, name: impl Into<String>, m: impl Module + 'static) -> Result<()> {
        let name = name.into();
        if name.is_empty() || name.contains('.') {
            return Err(Error::invalid(
                "ModuleDict::insert",
                format!("a module's name must be non-empty and without \".\": {name:?}"),
            ));
        }
        match self.modules.iter_mut().find(|(n, _)| *n == name) {
            Some((_, slot)) => *slot = Box::new(m),
            None => self.modules.push((name, Box::new(m))),
        }
        Ok(())
    }

    pub fn get(&self, name: &str) -> Option<&dyn Module> {
        self.modules
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, m)| m.as_ref())
    }

    pub fn keys(&self) -> impl Iterator<Item = &str> + '_ {
        self.modules.iter().map(|(n, _)| n.as_str())
    }

    pub fn len(&self) -> usize {
        self.modules.len()
    }

    pub fn is_empty(&self) -> bool {
        self.modules.is_empty()
    }

    fn named(&self) -> Vec<(String, &dyn Module)> {
        let each = self.modules.iter();
        each.map(|(k, m)| (k.clone(), m.as_ref())).collect()
    }

    fn visit(&self, f: impl Fn(&dyn Module) -> Vec<(String, Tensor)>) -> Vec<(String, Tensor)> {
        self.modules
            .iter()
            .flat_map(|(k, m)| {
                f(m.as_ref())
                    .into_iter()
                    .map(move |(n, t)| (format!("{k}.{n}"), t))
            })
            .collect()
    }

    fn each_mut(&mut self, f: impl Fn(&mut dyn Module) -> Result<()>) -> Result<()> {
        self.modules.iter_mut().try_for_each(|(_, m)| f(m.as_mut()))
    }

    fn modules_mut(&mut self) -> Vec<&mut dyn Module> {
        self.modules
            .iter_mut()
            .map(|(_, m)| m.as_mut() as &mut dyn Module)
            .collect()
    }
}

impl Module for ModuleDict {
    /// A dict has no forward of its own: call its modules.
    fn forward(&self, _x: &Tensor) -> Result<Tensor> {
        Err(Error::invalid(
            "ModuleDict",
            "a ModuleDict has no forward: call its modules (dict.get(name))",
        ))
    }
    container_methods!();
}
