#!/usr/bin/python3
"""Writes profiles/<name>.json: model profiles (src/pipesgd/timing/model_profile.h) of the papers' models.

Usage: scripts/make_paper_profiles.py [--out DIR]     (default: profiles/ of this repository)

Needs Debian's /usr/bin/python3 with python3-torch and python3-torchvision (0.14); the architectures
come from torchvision.models with weights=None (nothing is downloaded), the MNIST MLP is built here.
The output is deterministic: it depends only on the architectures' shapes, never on weights.

One profile layer per module that owns parameters directly (Conv2d, BatchNorm2d, Linear: weight and
bias together), in forward order: the order in which a forward pass first calls them (forward
hooks, one dummy example in training mode: 3x224x224 for the ImageNet models, 1x28x28 for the MLP).
`parameters` is the exact element count of the module's own parameters.

Forward FLOPs per example, counted by the same hooks from the shapes the module really saw:
  Conv2d       2 * Cin/groups * kh * kw * Cout * Hout * Wout   (a multiply-add is 2 FLOPs)
  Linear       2 * in * out
               (bias adds are not counted: under 0.1% of every model's FLOPs)
  BatchNorm2d  7 per output element: batch statistics 3 (add, square, add), normalise 2
               (subtract mean, multiply by 1/sigma), affine 2 (scale, shift)
Parameter-free operations (ReLU, pooling, dropout, residual adds, concatenation) are not counted:
several are functional calls no hook sees (F.relu in GoogLeNet, `out += identity` in ResNet), and
where hooks do see them they are 0.1-0.5% of a model's FLOPs.

Times:  forward_seconds  = FLOPs * batch / rate      backward_seconds = 2 * forward_seconds
(backward computes the input gradient and the weight gradient, each about one forward's FLOPs).
update_seconds = an SGD step with momentum streamed at the device's peak memory bandwidth: 20 bytes
per parameter (read weight, gradient, momentum; write momentum, weight); a lower bound.
data_seconds = 0 (input pipeline assumed overlapped), codecs = {} (no paper gives a codec cost; the
simulator charges nothing then).

Device (profiles/README.md explains the choice and compares the totals with measurements):
  ImageNet models: one GK210 GPU of an Nvidia Tesla K80 card, the GPU of MG-WFBP's cluster
  (mg-wfbp.txt Sec. V.B: one K80 card, i.e. 2 GPUs, per server; Sec. V.C simulates 64 K80 GPUs from
  per-layer times measured on one). Peak fp32 4.37 TFLOPS (2496 cores * 875 MHz boost * 2), peak
  memory bandwidth 240 GB/s (half the card's 480 GB/s). Effective compute rate 1.2e12 FLOP/s,
  27.5% of peak: the rate at which one K80 GPU trains ResNet-50 at batch 32 in TensorFlow's K80
  benchmark (49.5 images/s, tensorflow.org/performance/benchmarks, May 2017, GCE, synthetic data)
  with this file's FLOP count (3 * 8.256 GFLOP per image -> 1.23e12 FLOP/s).
  MNIST MLP: Pipe-SGD's Titan XP (pipe-sgd.txt Sec. 4, "Metrics and Setup"): peak fp32 12.15 TFLOPS
  (3840 cores * 1582 MHz * 2), 547.7 GB/s; the same 27.5% of peak, 3.34e12 FLOP/s.
GoogLeNet is torchvision's without its two auxiliary classifiers (aux_logits=False: 6,624,904
parameters); googlenet-aux.json keeps them (13,004,888), as Caffe's GoogLeNet that MG-WFBP trained
("about 13 millions of parameters", mg-wfbp.txt Sec. V) has them in its training net.
Batch per worker: ResNet-50 32 and GoogLeNet 64 (mg-wfbp.txt Sec. V); AlexNet 64 (pipe-sgd.txt
Sec. 4: global batch 256 on 4 workers); VGG-16 128 (sapipe.txt Sec. 5.1: 128 images per GPU);
MNIST-MLP 25 (pipe-sgd.txt Sec. 4: 784-500-500-10, global batch 100 on 4 workers).
"""
import argparse
import json
import os
import sys

import torch
from torch import nn
import torchvision
from torchvision import models

K80_GPU = {
    "name": "one GK210 GPU of an Nvidia Tesla K80",
    "peak_flops": 2496 * 875e6 * 2,  # 4.368e12: CUDA cores * boost clock * 2 (FMA)
    "peak_bytes_per_second": 240e9,  # 480 GB/s per K80 card, two GPUs
}
TITAN_XP = {
    "name": "Nvidia Titan XP",
    "peak_flops": 3840 * 1582e6 * 2,  # 12.15e12
    "peak_bytes_per_second": 547.7e9,
}
# Effective fp32 rate as a fraction of peak: 1.2e12 / 4.368e12, TensorFlow's K80 ResNet-50 batch-32
# training throughput (49.5 images/s) times this script's 3 * 8.256 GFLOP per image.
EFFICIENCY = 1.2e12 / K80_GPU["peak_flops"]
SGD_BYTES_PER_PARAMETER = 20  # momentum SGD: read w, g, v; write v, w (fp32)
BATCH_NORM_FLOPS_PER_ELEMENT = 7
BACKWARD_OVER_FORWARD = 2


class Mlp(nn.Module):
    """Pipe-SGD's MNIST-MLP: 784-500-500-10 (pipe-sgd.txt Sec. 4), as src/pipesgd/torch/torch_models.cpp."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 500)
        self.fc2 = nn.Linear(500, 500)
        self.fc3 = nn.Linear(500, 10)

    def forward(self, x):
        x = torch.flatten(x, 1)
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return self.fc3(x)


def module_flops(module, inputs, output):
    """Forward FLOPs per example of one call of `module` (batch 1)."""
    if isinstance(module, nn.Conv2d):
        cin = module.in_channels // module.groups
        kh, kw = module.kernel_size
        cout, hout, wout = output.shape[1:]
        return 2 * cin * kh * kw * cout * hout * wout
    if isinstance(module, nn.Linear):
        return 2 * module.in_features * module.out_features * (output.numel() // module.out_features)
    if isinstance(module, nn.BatchNorm2d):
        return BATCH_NORM_FLOPS_PER_ELEMENT * output.numel()
    raise SystemExit(f"make_paper_profiles: no FLOP rule for {type(module).__name__}")


def trace_layers(model, input_shape):
    """[(name, parameters, forward FLOPs per example)] in order of first call."""
    owners = [(name, m) for name, m in model.named_modules() if list(m.parameters(recurse=False))]
    flops = {}
    order = []
    handles = []
    for name, module in owners:
        def hook(module, inputs, output, name=name):
            if name not in flops:
                order.append(name)
                flops[name] = 0
            flops[name] += module_flops(module, inputs, output)
        handles.append(module.register_forward_hook(hook))
    model.train()  # a training forward: GoogLeNet's auxiliary classifiers run only in training
    with torch.no_grad():
        model(torch.zeros((1,) + input_shape))
    for handle in handles:
        handle.remove()
    by_name = dict(owners)
    if set(order) != set(by_name):
        raise SystemExit(f"make_paper_profiles: modules never called: {sorted(set(by_name) - set(order))}")
    layers = [(name, sum(p.numel() for p in by_name[name].parameters(recurse=False)), flops[name]) for name in order]
    total = sum(p.numel() for p in model.parameters())
    if sum(parameters for _, parameters, _ in layers) != total:
        raise SystemExit("make_paper_profiles: layers do not cover every parameter")
    return layers


def significant(value):
    """Six significant digits: the FLOP model is not more precise, and the JSON stays readable."""
    return float(f"{value:.6g}")


MODELS = [
    # file name, model field, builder, input shape, batch, device, batch's source, architecture note
    ("resnet50", "ResNet-50", lambda: models.resnet50(weights=None), (3, 224, 224), 32, K80_GPU,
     "MG-WFBP Sec. V", "torchvision resnet50"),
    ("googlenet", "GoogLeNet", lambda: models.googlenet(weights=None, aux_logits=False, init_weights=False),
     (3, 224, 224), 64, K80_GPU, "MG-WFBP Sec. V", "torchvision googlenet without the two auxiliary classifiers"),
    ("googlenet-aux", "GoogLeNet with auxiliary classifiers",
     lambda: models.googlenet(weights=None, aux_logits=True, init_weights=False), (3, 224, 224), 64, K80_GPU,
     "MG-WFBP Sec. V", "torchvision googlenet with its two auxiliary classifiers (as Caffe's, trained by MG-WFBP)"),
    ("vgg16", "VGG-16", lambda: models.vgg16(weights=None), (3, 224, 224), 128, K80_GPU,
     "SAPipe Sec. 5.1", "torchvision vgg16"),
    ("alexnet", "AlexNet", lambda: models.alexnet(weights=None), (3, 224, 224), 64, K80_GPU,
     "Pipe-SGD Sec. 4, global 256 on 4 workers", "torchvision alexnet"),
    ("mnist-mlp", "MNIST-MLP", Mlp, (1, 28, 28), 25, TITAN_XP,
     "Pipe-SGD Sec. 4, global 100 on 4 workers", "784-500-500-10 of Pipe-SGD Sec. 4"),
]


def make_profile(spec):
    file_name, model_name, build, input_shape, batch, device, batch_source, architecture = spec
    torch.manual_seed(0)
    layers = trace_layers(build(), input_shape)
    rate = EFFICIENCY * device["peak_flops"]
    parameters = sum(p for _, p, _ in layers)
    if device is K80_GPU:
        where = (f"one GK210 GPU of a Tesla K80 (MG-WFBP's cluster, Sec. V.B-C) at {100 * EFFICIENCY:.1f}% of its"
                 f" {device['peak_flops'] / 1e12:.2f} TFLOPS fp32 peak, the rate at which TensorFlow's K80 benchmark"
                 " trains ResNet-50 at batch 32 (49.5 images/s)")
    else:
        where = (f"Pipe-SGD's Titan XP (Sec. 4) at {100 * EFFICIENCY:.1f}% of its {device['peak_flops'] / 1e12:.2f}"
                 " TFLOPS fp32 peak, the fraction the K80 reaches in TensorFlow's ResNet-50 batch-32 benchmark")
    version = "" if file_name == "mnist-mlp" else f" (torchvision {torchvision.__version__.split('a')[0]})"
    source = (
        f"{architecture}, exact parameter counts. Per-layer forward time = forward FLOPs (conv 2*Cin/g*kh*kw*Cout*Hout*Wout,"
        f" linear 2*in*out, batch norm 7 per output) x batch {batch} ({batch_source}) / {rate / 1e12:.3g} TFLOPS: {where};"
        f" backward = 2 x forward; update = momentum SGD, 20 B/parameter at the {device['peak_bytes_per_second'] / 1e9:.4g} GB/s"
        f" peak memory bandwidth; no data or codec costs. Generated by scripts/make_paper_profiles.py{version}."
    )
    return {
        "format": "pipesgd-profile",
        "version": 1,
        "model": model_name,
        "source": source,
        # The device the times stand for: `pipesgd simulate` and `advise` print it (and --compute-scale).
        "device": f"{device['name']} (estimated from FLOPs at {100 * EFFICIENCY:.1f}% of its fp32 peak)",
        "batch": batch,
        "data_seconds": 0.0,
        "update_seconds": significant(SGD_BYTES_PER_PARAMETER * parameters / device["peak_bytes_per_second"]),
        "layers": [
            {
                "name": name,
                "parameters": count,
                "forward_seconds": significant(flops * batch / rate),
                "backward_seconds": significant(BACKWARD_OVER_FORWARD * flops * batch / rate),
            }
            for name, count, flops in layers
        ],
        "codecs": {},
    }, layers


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "profiles"))
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(1)
    print(f"{'profile':<12} {'layers':>6} {'parameters':>12} {'fwd GFLOP/ex':>12} {'batch':>5} {'fwd+bwd s':>10} {'update s':>9}")
    for spec in MODELS:
        profile, layers = make_profile(spec)
        path = os.path.join(args.out, spec[0] + ".json")
        text = json.dumps(profile, indent=2) + "\n"
        with open(path + ".tmp", "w") as out:
            out.write(text)
        os.replace(path + ".tmp", path)
        compute = sum(l["forward_seconds"] + l["backward_seconds"] for l in profile["layers"])
        print(f"{spec[0]:<12} {len(layers):>6} {sum(p for _, p, _ in layers):>12,} {sum(f for _, _, f in layers) / 1e9:>12.4f}"
              f" {profile['batch']:>5} {compute:>10.5f} {profile['update_seconds']:>9.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
