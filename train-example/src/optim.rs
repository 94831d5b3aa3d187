//! AdamW whose whole state can be checkpointed.
//!
//! candle-nn 0.11's `AdamW` keeps its moment estimates and step count
//! private (`candle-nn/src/optim.rs`: `VarAdamW` and `AdamW::step_t` have no
//! accessor), so a run resumed with it starts the moments from zero and
//! trains other weights than a run never stopped. This one applies the same
//! update (decoupled weight decay, bias-corrected moments; Loshchilov &
//! Hutter), term for term in the same order, and keeps the moments as named
//! variables of a [`VarMap`] that a checkpoint saves and loads beside the
//! weights.

use candle_core::backprop::GradStore;
use candle_core::{Result, Tensor, Var};
use candle_nn::{ParamsAdamW, VarMap};

/// AdamW over the float variables of a [`VarMap`].
pub(crate) struct AdamW {
    /// Each parameter with its first and second moment.
    vars: Vec<(Var, Var, Var)>,
    /// The moments, named `m.<parameter>` and `v.<parameter>`.
    moments: VarMap,
    /// Steps taken (the bias correction's exponent).
    step_t: u64,
    params: ParamsAdamW,
}

impl AdamW {
    /// Zero moments for every float variable of `varmap`.
    pub(crate) fn new(varmap: &VarMap, params: ParamsAdamW) -> Result<Self> {
        let moments = VarMap::new();
        let mut vars = Vec::new();
        {
            let data = varmap.data().lock().expect("the VarMap's lock");
            let mut store = moments.data().lock().expect("a new VarMap's lock");
            for (name, var) in data.iter().filter(|(_, v)| v.dtype().is_float()) {
                let zeros = || Var::zeros(var.shape(), var.dtype(), var.device());
                let (m, v) = (zeros()?, zeros()?);
                store.insert(format!("m.{name}"), m.clone());
                store.insert(format!("v.{name}"), v.clone());
                vars.push((var.clone(), m, v));
            }
        }
        Ok(Self {
            vars,
            moments,
            step_t: 0,
            params,
        })
    }

    /// Saves the moments to `path` (safetensors).
    pub(crate) fn save(&self, path: &std::path::Path) -> Result<()> {
        self.moments.save(path)
    }

    /// Loads the moments saved by [`save`](Self::save) and the step count.
    pub(crate) fn load(&mut self, path: &std::path::Path, steps: u64) -> Result<()> {
        self.moments.load(path)?;
        self.step_t = steps;
        Ok(())
    }

    /// Back-propagates `loss` and applies one update.
    pub(crate) fn backward_step(&mut self, loss: &Tensor) -> Result<()> {
        let grads = loss.backward()?;
        self.step(&grads)
    }

    fn step(&mut self, grads: &GradStore) -> Result<()> {
        self.step_t += 1;
        let p = &self.params;
        let (lr, beta1, beta2) = (p.lr, p.beta1, p.beta2);
        let decay = 1f64 - lr * p.weight_decay;
        let scale_m = 1f64 / (1f64 - beta1.powi(self.step_t as i32));
        let scale_v = 1f64 / (1f64 - beta2.powi(self.step_t as i32));
        for (theta, m, v) in &self.vars {
            let Some(g) = grads.get(theta) else { continue };
            let next_m = ((m.as_tensor() * beta1)? + (g * (1.0 - beta1))?)?;
            let next_v = ((v.as_tensor() * beta2)? + (g.sqr()? * (1.0 - beta2))?)?;
            let m_hat = (&next_m * scale_m)?;
            let v_hat = (&next_v * scale_v)?;
            let step = (m_hat / (v_hat.sqrt()? + p.eps)?)?;
            let next_theta = ((theta.as_tensor() * decay)? - (step * lr)?)?;
            m.set(&next_m)?;
            v.set(&next_v)?;
            theta.set(&next_theta)?;
        }
        Ok(())
    }
}
