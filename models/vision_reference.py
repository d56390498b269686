"""Reference forward passes of the vision models, in plain numpy (float64).

The tests run these on the initializers read back from the built .onnx files
and compare with ONNX Runtime. They are deliberately independent of the
builders: nothing here imports build_*.py or onnx_util.py; the architecture
(strides, paddings, where the residual connections and activations are) is
written out again from the torchvision definitions, and the layer widths are
read from the weight shapes. A wiring mistake in a builder therefore shows up
as a mismatch.

Convolutions are im2col + one matmul (grouped convs: one matmul per group;
depthwise: a sum of k*k shifted, scaled slices), fast enough for ResNet-50 at
batch 1 in about a second.
"""

from __future__ import annotations

import numpy as np

Params = dict[str, np.ndarray]

# torchvision.models.resnet50: Bottleneck blocks per stage; the first block of
# stages 2-4 has stride 2 (on the 3x3 conv: "ResNet v1.5").
RESNET50_LAYERS = (3, 4, 6, 3)
# torchvision.models.mobilenet_v2: expansion t, out channels c, repeats n, stride s.
MOBILENETV2_SETTINGS = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


# --------------------------------------------------------------------------- primitives


def _f64(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def conv2d(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None, stride: int = 1, pad: int = 0,
           groups: int = 1) -> np.ndarray:
    """NCHW convolution (cross-correlation, as ONNX Conv and torch), float64."""
    x, w = _f64(x), _f64(w)
    n, c, h, wd = x.shape
    c_out, cg, kh, kw = w.shape
    assert cg * groups == c, (w.shape, groups, x.shape)
    oh = (h + 2 * pad - kh) // stride + 1
    ow = (wd + 2 * pad - kw) // stride + 1
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad))) if pad else x
    if groups == c and cg == 1 and c_out == c:
        # Depthwise: out[:, ch] = sum_ij w[ch, 0, i, j] * shifted slice.
        y = np.zeros((n, c, oh, ow))
        for i in range(kh):
            for j in range(kw):
                sl = xp[:, :, i : i + stride * (oh - 1) + 1 : stride, j : j + stride * (ow - 1) + 1 : stride]
                y += sl * w[:, 0, i, j].reshape(1, c, 1, 1)
    else:
        # im2col: windows [n, c, oh, ow, kh, kw] -> rows [n*oh*ow, c*kh*kw] per group.
        win = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))[:, :, ::stride, ::stride]
        win = win[:, :, :oh, :ow]
        outs = []
        og = c_out // groups
        for g in range(groups):
            cols = win[:, g * cg : (g + 1) * cg].transpose(0, 2, 3, 1, 4, 5).reshape(n * oh * ow, cg * kh * kw)
            wg = w[g * og : (g + 1) * og].reshape(og, cg * kh * kw)
            outs.append((cols @ wg.T).reshape(n, oh, ow, og))
        y = np.concatenate(outs, axis=3).transpose(0, 3, 1, 2)
    if b is not None:
        y = y + _f64(b).reshape(1, -1, 1, 1)
    return np.ascontiguousarray(y)


def batchnorm(x: np.ndarray, gamma, beta, mean, var, eps: float = 1e-5) -> np.ndarray:
    """Inference-mode BatchNorm2d, written out (no folding)."""
    r = lambda v: _f64(v).reshape(1, -1, 1, 1)  # noqa: E731
    return (_f64(x) - r(mean)) / np.sqrt(r(var) + eps) * r(gamma) + r(beta)


def relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0.0)


def relu6(x: np.ndarray) -> np.ndarray:
    return np.minimum(np.maximum(x, 0.0), 6.0)


def maxpool2d(x: np.ndarray, k: int, stride: int, pad: int = 0) -> np.ndarray:
    n, c, h, w = x.shape
    xp = np.pad(_f64(x), ((0, 0), (0, 0), (pad, pad), (pad, pad)), constant_values=-np.inf) if pad else _f64(x)
    oh = (h + 2 * pad - k) // stride + 1
    ow = (w + 2 * pad - k) // stride + 1
    win = np.lib.stride_tricks.sliding_window_view(xp, (k, k), axis=(2, 3))[:, :, ::stride, ::stride]
    return win[:, :, :oh, :ow].max(axis=(4, 5))


def global_avgpool(x: np.ndarray) -> np.ndarray:
    """[n, c, h, w] -> [n, c] (pool + flatten)."""
    return _f64(x).mean(axis=(2, 3))


def linear(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """torch.nn.Linear: x @ w.T + b, w [out, in]."""
    return _f64(x) @ _f64(w).T + _f64(b)


def _conv(p: Params, name: str, x: np.ndarray, stride: int = 1, groups: int = 1) -> np.ndarray:
    w = p[f"{name}.weight"]
    return conv2d(x, w, p[f"{name}.bias"], stride=stride, pad=w.shape[2] // 2, groups=groups)


# --------------------------------------------------------------------------- models


def resnet50_forward(p: Params, x: np.ndarray, layers=RESNET50_LAYERS) -> np.ndarray:
    """torchvision ResNet (Bottleneck, expansion 4) with BN folded into each conv.

    Parameter names: conv1, layer{i}.{j}.conv{1,2,3}, layer{i}.{j}.downsample, fc.
    """
    y = relu(_conv(p, "conv1", x, stride=2))  # 7x7/2, pad 3
    y = maxpool2d(y, 3, 2, 1)
    for i, blocks in enumerate(layers, start=1):
        for j in range(blocks):
            pre = f"layer{i}.{j}"
            stride = 2 if (i > 1 and j == 0) else 1
            identity = y
            out = relu(_conv(p, f"{pre}.conv1", y))
            out = relu(_conv(p, f"{pre}.conv2", out, stride=stride))
            out = _conv(p, f"{pre}.conv3", out)
            needs_downsample = stride != 1 or y.shape[1] != out.shape[1]
            assert needs_downsample == (f"{pre}.downsample.weight" in p), pre
            if needs_downsample:
                identity = _conv(p, f"{pre}.downsample", y, stride=stride)
            y = relu(out + identity)
    return linear(global_avgpool(y), p["fc.weight"], p["fc.bias"])


def mobilenetv2_forward(p: Params, x: np.ndarray, settings=MOBILENETV2_SETTINGS) -> np.ndarray:
    """torchvision MobileNetV2 (width 1.0) with BN folded into each conv.

    Parameter names: features.0 (stem), features.{k}.{expand,dw,project}
    (k = 1..17), features.18 (last 1x1 conv), classifier.
    """
    y = relu6(_conv(p, "features.0", x, stride=2))
    k = 1
    for t, c, n, s in settings:
        for i in range(n):
            stride = s if i == 0 else 1
            pre = f"features.{k}"
            inp = y.shape[1]
            h = y
            if t != 1:
                h = relu6(_conv(p, f"{pre}.expand", h))
            else:
                assert f"{pre}.expand.weight" not in p, pre
            h = relu6(_conv(p, f"{pre}.dw", h, stride=stride, groups=h.shape[1]))
            h = _conv(p, f"{pre}.project", h)
            assert h.shape[1] == c, (pre, h.shape)
            y = y + h if (stride == 1 and inp == c) else h
            k += 1
    y = relu6(_conv(p, f"features.{k}", y))
    return linear(global_avgpool(y), p["classifier.weight"], p["classifier.bias"])


def lenet_forward(p: Params, x: np.ndarray) -> np.ndarray:
    """The digits CNN: x raw pixels [n, 1, 8, 8] in 0..16.

    x/16 -> conv1 3x3 pad 1 -> ReLU -> conv2 3x3 pad 1 -> ReLU -> maxpool 2
    -> flatten -> fc1 -> ReLU -> fc2.
    """
    y = _f64(x) / 16.0
    y = relu(_conv(p, "conv1", y))
    y = relu(_conv(p, "conv2", y))
    y = maxpool2d(y, 2, 2)
    y = y.reshape(len(y), -1)
    y = relu(linear(y, p["fc1.weight"], p["fc1.bias"]))
    return linear(y, p["fc2.weight"], p["fc2.bias"])
