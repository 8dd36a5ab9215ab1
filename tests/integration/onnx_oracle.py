# SPDX-License-Identifier: Apache-2.0
# PyTorch as the oracle for model.onnx (tests/integration/onnx_import.sh), run with Debian's
# /usr/bin/python3 (python3-torch, -torchvision, -onnx, -h5py).
#
#   onnx_oracle.py export MODEL DIR [SMOOTHING CLIP WD LARS_ETA]   torchvision MODEL (num_classes=10,
#       dropout 0) exported in training mode at 32x32 to DIR/model.onnx; a fixed batch of 16 in
#       DIR/batch.h5; and the state after one plain SGD step (lr 0.1, mean cross-entropy with
#       label_smoothing=SMOOTHING, gradients clipped by clip_grad_norm_(CLIP) when CLIP > 0,
#       weight decay WD on every parameter but biases and batch-norm ones, and with LARS_ETA > 0
#       LARS's per-tensor trust ratio on those)
#       from the file's own initializers in DIR/after.pt, taken by PyTorch in float32 (NCHW and
#       channels_last) and in float64.
#   onnx_oracle.py model MODEL DIR   only DIR/model.onnx, as `export` writes it (move_check.sh)
#   onnx_oracle.py compare MODEL DIR CKPT [LAYOUT] [CKPT LAYOUT ...]   every parameter of each
#       dptrain checkpoint equals PyTorch's step to 1e-3 of the update's size, every batch-norm
#       buffer to 1e-4, and the checkpoint loads into torchvision's MODEL with strict=True. With
#       LAYOUT channels_last (a run with model.channels_last = true), PyTorch's own float32 error
#       below is the larger of its NCHW and its channels_last step's; nchw (the default) its NCHW
#       step's. Several checkpoints share one load of DIR/after.pt (vgg11_bn's is 2.6 GB: 20 s).
#
# "PyTorch's step" is its float64 step: the exact answer both float32 programs approximate. At
# 32x32 the last stages of the deeper models see 1x1 maps, where batch norm over 16 values
# amplifies rounding, and PyTorch's own float32 step is then further than 1e-3 of the update
# from its float64 step (1.4% on resnet50's conv1). Where that happens a tensor may differ from
# the float64 step by twice PyTorch's own float32 error, and no more: dptrain must be as close
# to the exact step as PyTorch is. A tensor whose exact update is (almost) zero, as the bias of a
# batch norm that the next batch norm cancels, is compared at 1e-3 of 1% of the model's median
# update: all there is to compare there is rounding noise.
#
# ReLU gates on a knife edge: where a ReLU's input is within float32 rounding of zero, whether
# its gradient passes depends on the last bits of the sums before it, and any float32 program may
# decide that gate either way. Measured on an H200 (cuDNN 9.14): vgg11_bn's features.10 has an
# input 8.2e-7 from zero; cuDNN's sum order flips it, PyTorch's CPU order does not, and eight
# tensors upstream move by up to 1e-4 (2.5x to 40x their bounds). PyTorch's float64 step with that one gate
# flipped moves the same eight tensors by the same amounts (1.0e-4 against 8.2e-5 on
# features.8.weight). The forward barely changes (the value is ~0 either way); the backward
# changes exactly by the gradient through that element, g_i * d(input_i)/d(theta), which is
# linear, so any set of flips adds up. `export` takes the gates whose float64 input is within
# AMBIGUOUS times PyTorch's own float32 error on that element (the larger of NCHW's and
# channels_last's) and stores, per parameter, the sum of LR * |g_i * d(input_i)/d(theta)| over
# them; `compare` lets each element differ by that much more, and says how many tensors needed it.
#
# ops: a small network of the ops torchvision's families do not reach (nn.ZeroPad2d, which
# torch.onnx writes as a Pad fed by shape arithmetic on constants; a per-channel Add; ceil-mode
# max and average pooling, an average without the padding; nn.Linear without bias, written as
# MatMul of a Transpose). `export` also writes DIR/model_fused.onnx, the same file with the Pad
# merged into the next Conv's pads (top 0, left 1, bottom 2, right 1), as converters from other
# frameworks write uneven padding: the same model, so the same step.
#
# vgg11_bn: torchvision's VGG pools to 7x7 (AdaptiveAvgPool2d) before a 25088-wide classifier,
# which torch cannot export from the 1x1 map of a 32x32 input; it runs in the usual CIFAR form,
# no pooling and a 512-wide first classifier layer (same names).
#   onnx_oracle.py load MODEL DIR CKPT   only the strict=True load.
#   onnx_oracle.py torch_ckpt MODEL DIR OUT   PyTorch's float32 state after the step, written
#       with h5py as a DataParallel state_dict (`module.` names) to OUT, and that model's
#       eval-mode loss and accuracy on the batch in DIR/torch_eval.txt, as `dptrain eval` prints.
#   onnx_oracle.py same CKPT_A CKPT_B   every parameter and optimizer tensor bitwise equal.
#   onnx_oracle.py close A B REL   the numbers A and B agree to REL (relative).
import inspect
import statistics
import sys
import warnings

import h5py
import numpy as np
import onnx
import onnx.numpy_helper
import torch
import torch.nn.functional as F
import torchvision

LR = 0.1
warnings.filterwarnings("ignore")  # torch.onnx.export notes on num_batches_tracked
# torch.onnx.export's arguments for the files dptrain reads: training mode, no constant folding.
# torch 2.9 and later export through torch.export unless dynamo=False; the training-mode export
# dptrain reads is the TorchScript exporter's (what torch 1.13 writes).
EXPORT = dict(training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
              opset_version=13)
if "dynamo" in inspect.signature(torch.onnx.export).parameters:
    EXPORT["dynamo"] = False
AMBIGUOUS = 2  # a gate is ambiguous within this many times PyTorch's float32 error there


def relu_calls(m):
    """Makes m's ReLUs out-of-place and records each call's (input, output), in call order."""
    seen = []
    for mod in m.modules():
        if isinstance(mod, torch.nn.ReLU):
            mod.inplace = False
            mod.register_forward_hook(lambda mod, i, o: seen.append((i[0], o)))
    return seen


def ambiguity(m, calls, f32_inputs, loss):
    """Per parameter, LR * the sum over the ambiguous gates of |g_i * d(input_i)/d(theta)|, and
    the number of those gates (see the header). Call before loss.backward()."""
    names = [n for n, _ in m.named_parameters()]
    params = [p for _, p in m.named_parameters()]
    total = {n: torch.zeros_like(p) for n, p in zip(names, params)}
    if not calls:  # no nn.ReLU (mobilenet_v2's are ReLU6)
        return total, 0
    grads = torch.autograd.grad(loss, [o for _, o in calls], retain_graph=True)
    gates = 0
    for k, ((v, _), g) in enumerate(zip(calls, grads)):
        err = torch.stack([(a[k] - v.detach()).abs() for a in f32_inputs]).amax(0)
        near = (v.detach().abs() <= AMBIGUOUS * err).flatten().nonzero().flatten()
        for i in near.tolist():
            gi = g.flatten()[i]
            if gi == 0:
                continue
            dv = torch.autograd.grad(v.flatten()[i], params, retain_graph=True, allow_unused=True)
            for n, d in zip(names, dv):
                if d is not None:
                    total[n] += LR * (gi * d).abs()
            gates += 1
    return total, gates


class Ops(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.pad = torch.nn.ZeroPad2d((1, 1, 0, 2))  # left, right, top, bottom
        self.conv = torch.nn.Conv2d(3, 8, 3)
        self.bn = torch.nn.BatchNorm2d(8)
        self.shift = torch.nn.Conv2d(8, 8, 1)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8 * 5 * 5, 10, bias=False)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(self.pad(x))))  # 32x32 -> 34x34 -> 32x32
        y = y + self.shift(F.adaptive_avg_pool2d(y, 1))  # per-channel shift
        y = F.max_pool2d(y, 3, 2, ceil_mode=True)  # 32 -> 16 (15 in floor mode)
        y = torch.tanh(self.conv2(y))
        y = F.avg_pool2d(y, 3, 2, 1, ceil_mode=True)  # 16 -> 9, last window past the padding
        y = F.avg_pool2d(y, 3, 2, 1, ceil_mode=True, count_include_pad=False)  # 9 -> 5
        return self.fc(torch.flatten(y, 1))


def build(name):
    torch.manual_seed(0)
    if name == "ops":
        return Ops()
    m = getattr(torchvision.models, name)(num_classes=10)
    if name.startswith("vgg"):
        m.avgpool = torch.nn.Identity()
        m.classifier[0] = torch.nn.Linear(512, 4096)
    for mod in m.modules():
        if isinstance(mod, torch.nn.Dropout):
            mod.p = 0.0
    return m


def from_onnx(name, path):
    """The torchvision model holding the ONNX file's initializers (its starting weights)."""
    m = build(name)
    inits = {t.name: torch.from_numpy(onnx.numpy_helper.to_array(t).copy())
             for t in onnx.load(path).graph.initializer}
    state = m.state_dict()
    for k in state:
        if k.endswith("num_batches_tracked"):
            continue
        state[k] = inits[k].reshape(state[k].shape)
    m.load_state_dict(state, strict=True)
    return m


def export(name, out, smoothing=0.0, clip=0.0, wd=0.0, lars_eta=0.0):
    m = build(name).train()
    x = torch.randn(16, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 10, (16,), generator=torch.Generator().manual_seed(2))
    torch.onnx.export(m, x, f"{out}/model.onnx", **EXPORT)
    if name == "ops":
        fuse_pad(f"{out}/model.onnx", f"{out}/model_fused.onnx")
    with h5py.File(f"{out}/batch.h5", "w") as f:
        f["images"] = x.numpy().astype(np.float32)
        f["labels"] = y.numpy().astype(np.int32)
        f.attrs["classes"] = 10
    steps, f32_inputs = {}, []
    for key, dtype, fmt in (("f32", torch.float32, torch.contiguous_format),
                            ("f32cl", torch.float32, torch.channels_last),
                            ("f64", torch.float64, torch.contiguous_format)):
        m = from_onnx(name, f"{out}/model.onnx").to(dtype).to(memory_format=fmt).train()
        before = {k: v.clone().float() for k, v in m.state_dict().items()}
        calls = relu_calls(m)
        loss = F.cross_entropy(m(x.to(dtype).contiguous(memory_format=fmt)), y,
                               label_smoothing=smoothing)
        if dtype == torch.float32:
            f32_inputs.append([v.detach().double() for v, _ in calls])
        else:
            amb, gates = ambiguity(m, calls, f32_inputs, loss)
        loss.backward()
        if clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(m.parameters(), clip)
            print(f"{name} ({dtype}): gradient norm {norm.item():.4g}, clipped to {clip}")
        # Weight decay wd on every parameter but biases and batch-norm ones (the param groups of
        # torchvision's recipes; dptrain's train.no_weight_decay = ["bias", "bn"]).
        bn = {id(p) for mod in m.modules() if isinstance(mod, torch.nn.BatchNorm2d)
              for p in mod.parameters()}
        with torch.no_grad():
            for n, p in m.named_parameters():
                excluded = n.endswith(".bias") or id(p) in bn
                decay = 0.0 if excluded else wd
                trust = 1.0
                if lars_eta > 0 and not excluded:  # LARS as torchlars computes it
                    wn, gn = p.norm().item(), p.grad.norm().item()
                    if wn > 0 and gn > 0:
                        trust = lars_eta * wn / (gn + wd * wn + 1e-8)
                p -= LR * trust * (p.grad + decay * p)
        steps[key] = {k: v.clone().contiguous() for k, v in m.state_dict().items()}
    torch.save({"before": before, "after32": steps["f32"], "after32cl": steps["f32cl"],
                "after64": steps["f64"], "ambiguous": amb, "gates": gates}, f"{out}/after.pt")


def model_only(name, out):
    """Only the export: out/model.onnx in training mode, as `export` writes it."""
    m = build(name).train()
    x = torch.randn(16, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    torch.onnx.export(m, x, f"{out}/model.onnx", **EXPORT)


def fuse_pad(src, dst):
    """src with its Pad node folded into the Conv reading it (ONNX pads: begins, then ends)."""
    m = onnx.load(src)
    nodes = list(m.graph.node)
    pad = next(n for n in nodes if n.op_type == "Pad")
    conv = next(n for n in nodes if n.op_type == "Conv" and n.input[0] == pad.output[0])
    conv.input[0] = pad.input[0]
    for a in conv.attribute:
        if a.name == "pads":
            a.ints[:] = [0, 1, 2, 1]  # top, left, bottom, right
    m.graph.ClearField("node")
    m.graph.node.extend(n for n in nodes if n is not pad)
    onnx.checker.check_model(m)
    onnx.save(m, dst)


def compare(name, out, *runs):
    """Each (checkpoint, layout) of `runs` against PyTorch's step; exits 1 if any is off."""
    ref = torch.load(f"{out}/after.pt")
    params = {n for n, _ in build(name).named_parameters()}
    runs = list(runs) + ([] if len(runs) % 2 == 0 else ["nchw"])
    ok = [compare_one(name, ref, params, runs[i], runs[i + 1]) for i in range(0, len(runs), 2)]
    if not all(ok):
        sys.exit(1)


def compare_one(name, ref, params, ckpt, layout):
    before, after = ref["before"], ref["after64"]
    after32 = [ref["after32"]] + ([ref["after32cl"]] if layout == "channels_last" else [])
    state = {}
    with h5py.File(ckpt, "r") as f:
        for k, d in f["params"].items():
            state[k] = torch.from_numpy(np.array(d))
    bad = []
    worst = (0.0, "")  # the largest error / tolerance
    slack = 0  # tensors that need the float32 allowance (further than 1e-3 of the update)
    gated = 0  # tensors within their bound only with the ambiguous gates' allowance
    steps = {k: (after[k] - before[k].to(after[k].dtype)).abs().max().item() for k in params}
    typical = statistics.median(steps.values())
    for k, want in after.items():
        if k.endswith("num_batches_tracked"):
            continue
        got = state[k].reshape(want.shape).to(want.dtype)
        diff = (got - want).abs()
        plain = diff.max().item()
        if k in ref["ambiguous"]:  # what the knife-edge ReLU gates may move it by
            diff = (diff - ref["ambiguous"][k].to(want.dtype)).clamp(min=0)
        err = diff.max().item()
        torch_err = max((a[k].to(want.dtype) - want).abs().max().item() for a in after32)
        if k in params:
            # A tensor with (almost) no update of its own, such as the bias of a batch norm that
            # the next batch norm cancels (exactly zero gradient), has only rounding noise to
            # compare: 1e-3 of at least 1% of the model's median update.
            tol = 1e-3 * max(steps[k], 1e-2 * typical)
        else:  # running mean / variance
            tol = 1e-4 * max(1.0, want.abs().max().item())
        if err > tol:
            slack += 1
        # Where PyTorch's float64 update is zero to rounding (a conv bias that batch norm
        # cancels), both float32 steps move the tensor by summation noise alone, and noise is
        # compared with noise: vgg11_bn's features.0.bias (a sum over 16 x 32 x 32 positions)
        # moves 2.0e-8 in PyTorch's NCHW step and 3.5e-8 or 4.3e-8 in dptrain's, depending on
        # float32 sum orders far upstream (its linear layers' GEMM kernel).
        noise_only = k in params and steps[k] < 1e-9 * typical
        tol = max(tol, (4 if noise_only else 2) * torch_err)
        if plain > tol >= err:
            gated += 1
        if err / tol > worst[0]:
            worst = (err / tol, k)
        if not err <= tol:
            bad.append(f"{k}: max |dptrain - torch fp64| {err:.3g} > {tol:.3g} "
                       f"(torch fp32: {torch_err:.3g})")
    if bad:
        print(f"{name} ({layout}, {ckpt}):")
        print("\n".join(bad[:20]))
        return False
    print(f"{name} ({layout}): {len(after)} tensors agree with PyTorch's float64 step; closest to "
          f"its bound: {worst[1]} at {worst[0]:.2f}x; {slack} need the float32 allowance; "
          f"{ref['gates']} ReLU gates within float32 rounding of zero, which {gated} need")
    load(name, ckpt, state)
    return True


def load(name, ckpt, state=None):
    if state is None:
        with h5py.File(ckpt, "r") as f:
            state = {k: torch.from_numpy(np.array(d)) for k, d in f["params"].items()}
    m = build(name)
    m.load_state_dict({k: v.reshape(m.state_dict()[k].shape) for k, v in state.items()},
                      strict=True)
    print(f"{name}: {ckpt} loads with load_state_dict(strict=True)")


def torch_ckpt(name, out, path):
    state = torch.load(f"{out}/after.pt")["after32"]
    m = build(name)
    m.load_state_dict({k: v.to(m.state_dict()[k].dtype) for k, v in state.items()}, strict=True)
    wrapped = torch.nn.DataParallel(m)
    with h5py.File(path, "w") as f:
        for k, t in wrapped.state_dict().items():
            assert k.startswith("module.")
            f["params/" + k] = t.cpu().numpy()
    m = wrapped.module.cpu()  # where CUDA is available DataParallel moved it to a GPU
    with h5py.File(f"{out}/batch.h5", "r") as f:
        x = torch.from_numpy(np.array(f["images"]))
        y = torch.from_numpy(np.array(f["labels"])).long()
    with torch.no_grad():
        logits = m.eval()(x)
    loss = F.cross_entropy(logits, y).item()
    acc = (logits.argmax(1) == y).float().mean().item()
    open(f"{out}/torch_eval.txt", "w").write(f"test_loss {loss:.6f} test_accuracy {acc:.4f}")


def same(a, b):
    """Exit 0 when every tensor of checkpoints a and b (params, optimizer) is bitwise equal."""
    def tensors(path):
        out = {}
        with h5py.File(path, "r") as f:
            for group in ("params", "optimizer"):
                if group in f:
                    f[group].visititems(lambda n, o, g=group: out.__setitem__(
                        g + "/" + n, o[()]) if isinstance(o, h5py.Dataset) else None)
        return out
    ta, tb = tensors(a), tensors(b)
    diff = sorted(k for k in ta.keys() | tb.keys()
                  if k not in ta or k not in tb or ta[k].tobytes() != tb[k].tobytes())
    print(f"{len(ta)} tensors, {len(diff)} differ" + (f" (first {diff[0]})" if diff else ""))
    sys.exit(1 if diff else 0)


def close(a, b, rel):
    a, b, rel = float(a), float(b), float(rel)
    ok = abs(a - b) <= rel * max(abs(a), abs(b))
    print(f"{a} vs {b}: {'within' if ok else 'NOT within'} {rel} (relative)")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    if sys.argv[1] == "export":
        export(sys.argv[2], sys.argv[3], *[float(a) for a in sys.argv[4:8]])
    elif sys.argv[1] == "model":
        model_only(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "load":
        load(sys.argv[2], sys.argv[4])
    elif sys.argv[1] == "torch_ckpt":
        torch_ckpt(sys.argv[2], sys.argv[3], sys.argv[4])
    elif sys.argv[1] == "same":
        same(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "close":
        close(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        compare(*sys.argv[2:])
