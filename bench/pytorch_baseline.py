#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""PyTorch baseline for bench/run.sh and bench/gpu.sh: the same model, batch, optimizer and
in-memory data shape as dptrain's benchmark runs, timed in one process (or one DDP job). Modes:

  pytorch_baseline.py --model M --ranks R --threads T --batch B --precision P --warmup W --steps S
      trains W steps, then times S steps; prints one line
      `pytorch <model> <R>x<T> batch <B> <P> samples_per_s <X>`.
  pytorch_baseline.py --device cuda --model M --batch B --precision P [--tf32 default|off]
      the same on one GPU (bench/gpu.sh), as PyTorch runs best there: channels-last,
      cudnn.benchmark, bf16 through autocast, data on the GPU, timed between synchronisations;
      TF32 as PyTorch's default (on for convolutions) or off (strict fp32, dptrain's "fp32");
      prints `pytorch <model> cuda batch <B> <P> tf32 <default|off> samples_per_s <X>`.
  pytorch_baseline.py --describe M [--against INSPECT_TXT]
      prints `model <M> params <trainable parameters> macs_per_sample <forward multiply-adds>`,
      counted from the layer shapes (Conv2d and Linear only) by hooks on one forward pass. With
      --against (the output of `dptrain inspect` on a checkpoint of the same model), first checks
      that dptrain's parameters and buffers have the state_dict's names and shapes; exits 1 if not.
  pytorch_baseline.py --blas
      prints which BLAS library torch's Linear (addmm) runs on in this process (the library
      libtorch's sgemm_ binds to), its OpenBLAS config, kernel and thread count where it is
      OpenBLAS, and an fp32 GEMM's GFLOP/s on one thread.

The models are dptrain's zoo models (models/zoo/zoo.cc) layer for layer: same layers, shapes,
bias flags, batch-norm eps/momentum and residual structure, so FLOPs and maths are the same job.

Run it the way bench/run.sh does, or the numbers are not PyTorch at its best: OPENBLAS_NUM_THREADS=1
and GLIBC_TUNABLES=glibc.malloc.mmap_threshold=4294967296:glibc.malloc.trim_threshold=4294967296
(without them glibc hands PyTorch's step buffers back to the kernel every step and the run is
page-fault bound); the system BLAS must be OpenBLAS, not the reference BLAS (Debian's torch calls
the system BLAS for Linear). Single process: torch.set_num_threads(threads). Data parallel:
DistributedDataParallel over gloo with processes spawned by torch.multiprocessing
(torch.distributed.run of Debian's torch 1.13 crashes under Python 3.11). Tensors are
channels-last by default (--memory-format): PyTorch's CPU tuning advice for CNNs, 1.2-1.6x faster
than NCHW on these models here (bench/README.md)."""
import argparse
import ctypes
import os
import re
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torchvision  # noqa: E402


class RefCnn(nn.Module):
    """zoo.cc RefCnn: conv1 3x3 1->32 (bias) relu maxpool2, conv2 3x3 32->64 (bias) relu
    maxpool2, flatten, fc1 3136->128 relu, fc2 128->classes."""

    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(3136, 128)
        self.fc2 = nn.Linear(128, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        return self.fc2(F.relu(self.fc1(x)))


class BasicBlock(nn.Module):
    """zoo.cc BasicBlock: conv1 3x3/stride (no bias) bn1 relu conv2 3x3 (no bias) bn2, plus the
    shortcut (1x1/stride conv, no bias, + bn when the shape changes; else identity), then relu."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, 0, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(y + self.shortcut(x))


class ResNet8(nn.Module):
    """zoo.cc ResNet8: conv1 3x3 3->16 (no bias) bn1 relu, stages of one BasicBlock each
    (16 stride 1, 32 stride 2, 64 stride 2), global average pool, flatten, fc 64->classes."""

    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.layer1 = nn.Sequential(BasicBlock(16, 16, 1))
        self.layer2 = nn.Sequential(BasicBlock(16, 32, 2))
        self.layer3 = nn.Sequential(BasicBlock(32, 64, 2))
        self.fc = nn.Linear(64, classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self.fc(x)


def ResNet18Cifar(classes=10):
    """zoo.cc resnet18_cifar: torchvision's resnet18 (its names) with the CIFAR stem, conv1 3x3/1
    and no max pool."""
    m = torchvision.models.resnet18(num_classes=classes)
    m.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
    m.maxpool = nn.Identity()
    return m


# model -> (class, input sample shape, optimizer settings of its configs/*.toml)
MODELS = {
    "resnet18_cifar": (ResNet18Cifar, (3, 32, 32), dict(lr=0.1, momentum=0.9, nesterov=True,
                                                         weight_decay=5e-4)),
    "ref_cnn": (RefCnn, (1, 28, 28), dict(lr=0.05, momentum=0.9, weight_decay=5e-4)),
    "resnet8": (ResNet8, (3, 32, 32), dict(lr=0.1, momentum=0.9, nesterov=True,
                                            weight_decay=5e-4)),
    # zoo.cc resnet50: torchvision's, 224x224; the optimizer of configs/imagenet_resnet50.toml.
    "resnet50": (lambda classes=10: torchvision.models.resnet50(num_classes=classes),
                 (3, 224, 224), dict(lr=0.1, momentum=0.9, weight_decay=1e-4)),
}


def same_tensors(model, inspect_txt):
    """Names and shapes of the /params tensors in `dptrain inspect` output == model.state_dict()."""
    theirs, in_params = {}, False
    for line in open(inspect_txt):
        if not line.startswith(" "):  # a section header: "/params (...)", "optimizer sgd: ..."
            in_params = line.startswith("/params")
            continue
        m = re.match(r"\s+(\S+)\s+\S+\s+(\[[^\]]*\]|scalar)", line)
        if in_params and m:
            theirs[m[1]] = [] if m[2] == "scalar" else [int(d) for d in m[2][1:-1].split(",")]
    ours = {k: list(v.shape) for k, v in model.state_dict().items()}
    if ours == theirs:
        return True
    for k in sorted(set(ours) | set(theirs)):
        if ours.get(k) != theirs.get(k):
            print(f"  {k}: pytorch {ours.get(k)} dptrain {theirs.get(k)}", file=sys.stderr)
    return False


def describe(name, against):
    cls, shape, _ = MODELS[name]
    model = cls()
    if against and not same_tensors(model, against):
        sys.exit(f"pytorch baseline: {name} differs from dptrain's (names and shapes above)")
    macs = 0

    def hook(mod, inp, out):
        nonlocal macs
        if isinstance(mod, nn.Conv2d):
            k = mod.in_channels // mod.groups * mod.kernel_size[0] * mod.kernel_size[1]
            macs += out[0].numel() * k  # per sample: output elements x inputs each
        elif isinstance(mod, nn.Linear):
            macs += mod.in_features * mod.out_features

    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            m.register_forward_hook(hook)
    with torch.no_grad():
        model(torch.zeros(1, *shape))
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    print(f"model {name} params {params} macs_per_sample {macs}")


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def blas():
    torch.set_num_threads(1)
    F.linear(torch.rand(64, 3136), torch.rand(128, 3136))  # Linear's path: addmm -> sgemm_
    # The library whose sgemm_ libtorch_cpu binds to: dlsym in libtorch's own dependency order,
    # then dladdr. Mapped files alone do not tell: with libblas.so.3 on the reference BLAS and
    # liblapack.so.3 on OpenBLAS, both are loaded and the reference sgemm_ wins.
    torch_lib = next(ln.split()[-1] for ln in open("/proc/self/maps") if "libtorch_cpu" in ln)
    lib, kind, extra, core = "none", "unknown (libtorch_cpu imports no sgemm_)", "", "-"
    try:
        addr = ctypes.cast(ctypes.CDLL(torch_lib).sgemm_, ctypes.c_void_p).value
        info = _DlInfo()
        if ctypes.CDLL(None).dladdr(ctypes.c_void_p(addr), ctypes.byref(info)):
            lib = os.path.realpath(info.dli_fname.decode())
    except AttributeError:
        pass
    if lib != "none":
        low = lib.lower()
        kind = ("OpenBLAS" if "openblas" in low else "BLIS" if "blis" in low else
                "MKL" if "mkl" in low else "ATLAS" if "atlas" in low else
                "reference BLAS (netlib)" if "/blas/" in low else "unknown")
    if kind == "OpenBLAS":
        ob = ctypes.CDLL(lib)
        ob.openblas_get_config.restype = ctypes.c_char_p
        ob.openblas_get_corename.restype = ctypes.c_char_p
        core = ob.openblas_get_corename().decode()
        extra = (f"; {ob.openblas_get_config().decode().strip()}, "
                 f"{ob.openblas_get_num_threads()} thread(s)")
    n = 1024
    a, b = torch.rand(n, n), torch.rand(n, n)
    torch.mm(a, b)
    reps = 8
    t0 = time.perf_counter()
    for _ in range(reps):
        torch.mm(a, b)
    gflops = 2 * n ** 3 * reps / (time.perf_counter() - t0) / 1e9
    print(f"blas {kind} lib {lib}{extra}")
    print(f"blas_core {core}")
    print(f"gemm_gflops_1thread {gflops:.1f}")


def train(rank, world, args, result):
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    cls, shape, opt_args = MODELS[args.model]
    fmt = torch.channels_last if args.memory_format == "channels_last" else torch.contiguous_format
    model = cls().to(memory_format=fmt)
    if world > 1:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(args.port)
        torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
        model = nn.parallel.DistributedDataParallel(model)
    model.train()
    opt = torch.optim.SGD(model.parameters(), **opt_args)
    b = args.batch // world
    n = 2048  # samples held in RAM, as dptrain's cached data set
    data = torch.rand(n, *shape).contiguous(memory_format=fmt)
    labels = torch.randint(0, 10, (n,))
    bf16 = args.precision == "bf16"

    def step(i):
        lo = (i * b) % (n - b)
        x, y = data[lo:lo + b], labels[lo:lo + b]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for i in range(args.warmup):
        step(i)
    if world > 1:
        torch.distributed.barrier()
    t0 = time.perf_counter()
    for i in range(args.steps):
        step(i)
    if world > 1:
        torch.distributed.barrier()
    dt = time.perf_counter() - t0
    if rank == 0:
        result.put(args.steps * args.batch / dt)
    if world > 1:
        torch.distributed.destroy_process_group()


def train_cuda(args):
    """One GPU, PyTorch at its best for these CNNs: channels-last, cudnn.benchmark, autocast."""
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    if args.tf32 == "off":
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    cls, shape, opt_args = MODELS[args.model]
    fmt = torch.channels_last
    model = cls().to(dev, memory_format=fmt).train()
    opt = torch.optim.SGD(model.parameters(), **opt_args)
    b, n = args.batch, 4 * args.batch
    data = torch.rand(n, *shape, device=dev).contiguous(memory_format=fmt)
    labels = torch.randint(0, 10, (n,), device=dev)
    bf16 = args.precision == "bf16"

    def step(i):
        lo = (i % 4) * b
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(data[lo:lo + b]), labels[lo:lo + b])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for i in range(args.warmup):
        step(i)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(args.steps):
        step(i)
    torch.cuda.synchronize()
    sps = args.steps * b / (time.perf_counter() - t0)
    print(f"pytorch {args.model} cuda batch {b} {args.precision} tf32 {args.tf32} "
          f"samples_per_s {sps:.0f} (torch {torch.__version__}, cuDNN "
          f"{torch.backends.cudnn.version()}, {torch.cuda.get_device_name()})")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="ref_cnn", choices=sorted(MODELS))
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--memory-format", default="channels_last", choices=["channels_last", "nchw"],
                   help="activations and weights in NHWC (PyTorch's advice for CNNs on CPU; "
                   "faster here in every row) or NCHW")
    p.add_argument("--port", type=int, default=29533, help="gloo rendezvous port (ranks > 1)")
    p.add_argument("--describe", metavar="MODEL", choices=sorted(MODELS))
    p.add_argument("--against", metavar="INSPECT_TXT",
                   help="with --describe: the output of dptrain inspect on a checkpoint")
    p.add_argument("--blas", action="store_true")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--tf32", default="default", choices=["default", "off"],
                   help="cuda: TF32 as PyTorch's default (convolutions) or off (strict fp32)")
    args = p.parse_args()
    if args.describe:
        return describe(args.describe, args.against)
    if args.blas:
        return blas()
    if args.device == "cuda":
        return train_cuda(args)
    ctx = torch.multiprocessing.get_context("spawn")
    result = ctx.SimpleQueue()
    if args.ranks == 1:
        train(0, 1, args, result)
    else:
        procs = [ctx.Process(target=train, args=(r, args.ranks, args, result))
                 for r in range(args.ranks)]
        for pr in procs:
            pr.start()
        for pr in procs:
            pr.join()
            if pr.exitcode != 0:
                sys.exit("pytorch baseline: a rank failed")
    sps = result.get()
    print(f"pytorch {args.model} {args.ranks}x{args.threads} batch {args.batch} {args.precision} "
          f"samples_per_s {sps:.0f}")


if __name__ == "__main__":
    main()
