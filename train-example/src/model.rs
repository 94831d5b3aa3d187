//! CIFAR-style ResNets (He et al. 2016, section 4.2) built with candle-nn.

use candle_core::{Module, ModuleT, Result, Tensor};
use candle_nn::{
    batch_norm, conv2d_no_bias, linear, BatchNorm, Conv2d, Conv2dConfig, Linear, VarBuilder,
};

/// conv3x3 -> BN -> ReLU -> conv3x3 -> BN, plus a (projected) shortcut.
struct Block {
    conv1: Conv2d,
    bn1: BatchNorm,
    conv2: Conv2d,
    bn2: BatchNorm,
    shortcut: Option<(Conv2d, BatchNorm)>,
}

fn conv(cin: usize, cout: usize, k: usize, stride: usize, vb: VarBuilder) -> Result<Conv2d> {
    let cfg = Conv2dConfig {
        padding: k / 2,
        stride,
        ..Default::default()
    };
    conv2d_no_bias(cin, cout, k, cfg, vb)
}

impl Block {
    fn new(cin: usize, cout: usize, stride: usize, vb: VarBuilder) -> Result<Self> {
        let shortcut = if stride != 1 || cin != cout {
            Some((
                conv(cin, cout, 1, stride, vb.pp("down.conv"))?,
                batch_norm(cout, 1e-5, vb.pp("down.bn"))?,
            ))
        } else {
            None
        };
        Ok(Self {
            conv1: conv(cin, cout, 3, stride, vb.pp("conv1"))?,
            bn1: batch_norm(cout, 1e-5, vb.pp("bn1"))?,
            conv2: conv(cout, cout, 3, 1, vb.pp("conv2"))?,
            bn2: batch_norm(cout, 1e-5, vb.pp("bn2"))?,
            shortcut,
        })
    }

    fn forward_t(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        let y = self.bn1.forward_t(&self.conv1.forward(x)?, train)?.relu()?;
        let y = self.bn2.forward_t(&self.conv2.forward(&y)?, train)?;
        let s = match &self.shortcut {
            Some((c, bn)) => bn.forward_t(&c.forward(x)?, train)?,
            None => x.clone(),
        };
        (y + s)?.relu()
    }
}

/// ResNet-(6n+2): a stem, three stages of `n` blocks at widths w, 2w, 4w
/// (strides 1, 2, 2), global average pooling and a linear classifier.
pub(crate) struct ResNet {
    stem: Conv2d,
    stem_bn: BatchNorm,
    blocks: Vec<Block>,
    head: Linear,
}

impl ResNet {
    /// ResNet-(6n+2) of base width `width` for `classes` classes.
    pub(crate) fn new(n: usize, width: usize, classes: usize, vb: VarBuilder) -> Result<Self> {
        let mut blocks = Vec::new();
        let mut cin = width;
        for (stage, mult) in [1, 2, 4].into_iter().enumerate() {
            let cout = width * mult;
            for i in 0..n {
                let stride = if stage > 0 && i == 0 { 2 } else { 1 };
                blocks.push(Block::new(
                    cin,
                    cout,
                    stride,
                    vb.pp(format!("s{stage}.b{i}")),
                )?);
                cin = cout;
            }
        }
        Ok(Self {
            stem: conv(3, width, 3, 1, vb.pp("stem"))?,
            stem_bn: batch_norm(width, 1e-5, vb.pp("stem_bn"))?,
            blocks,
            head: linear(cin, classes, vb.pp("head"))?,
        })
    }

    /// Logits for `x: f32 [n, 3, h, w]`; `train` switches batch norm to batch statistics.
    pub(crate) fn forward_t(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        let mut y = self
            .stem_bn
            .forward_t(&self.stem.forward(x)?, train)?
            .relu()?;
        for b in &self.blocks {
            y = b.forward_t(&y, train)?;
        }
        let y = y.mean(3)?.mean(2)?;
        self.head.forward(&y)
    }
}
