#!/usr/bin/python3
"""Exports TorchScript models for `pipesgd train --model DIR/NAME.pt` (inputs [batch, 1, 28, 28]
for the MNIST-format data sets, 10 classes).

Run with Debian's interpreter, which has python3-torch and python3-torchvision:

    /usr/bin/python3 examples/export_models.py --out models

Writes (deterministic: torch.manual_seed(0)):
  resnet18.pt     torchvision's ResNet-18 for 1x28x28 inputs: conv1 3x3 stride 1 with 1 input channel,
                  no max-pool, 10 classes (11.2 M parameters); cross-entropy.
  gru.pt          a GRU (hidden 64) over the image's 28 rows, then Linear 64-10; cross-entropy.
  transformer.pt  a 2-layer TransformerEncoder (d_model 32, 4 heads) over the rows, mean-pooled,
                  then Linear 32-10; cross-entropy.
  mlp.pt          the built-in mlp's architecture and parameter order (fc1, fc2, fc3: Linear
                  784-500-500-10, weight then bias; inputs flattened); cross-entropy.
  mlp_logsoftmax.pt  the same with log_softmax at the end, for --loss nll.
  regression.pt   Linear 4-8, tanh, Linear 8-1: inputs [batch, 4], output [batch, 1]; --loss mse.
With --test-models also the files the tests use for bad input:
  no_parameters.pt  a module without parameters (flattens its input, keeps 10 values);
  five_logits.pt    Linear 784-5: too few classes for 10-class data;
  state_dict.pt     torch.save of a state dict: a zip file, but not TorchScript.
"""
import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F


class Mlp(nn.Module):
    def __init__(self, log_softmax: bool = False):
        super().__init__()
        self.fc1 = nn.Linear(784, 500)
        self.fc2 = nn.Linear(500, 500)
        self.fc3 = nn.Linear(500, 10)
        self.log_softmax = log_softmax

    def forward(self, x):
        x = x.flatten(1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        x = self.fc3(x)
        if self.log_softmax:
            x = F.log_softmax(x, dim=1)
        return x


class RowGru(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(28, 64, batch_first=True)
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        rows = x.reshape(x.size(0), 28, 28)
        _, hidden = self.gru(rows)
        return self.fc(hidden[0])


class RowTransformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(28, 32)
        layer = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        rows = self.embed(x.reshape(x.size(0), 28, 28))
        return self.fc(self.encoder(rows).mean(1))


class Regression(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 1)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x.reshape(x.size(0), 4))))


class NoParameters(nn.Module):
    def forward(self, x):
        return x.flatten(1)[:, :10]


def resnet18():
    import torchvision
    net = torchvision.models.resnet18(num_classes=10)
    net.conv1 = nn.Conv2d(1, 64, kernel_size=3, stride=1, padding=1, bias=False)
    net.maxpool = nn.Identity()
    return net


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="directory to write the .pt files to")
    parser.add_argument("--test-models", action="store_true", help="also write the bad-input files the tests use")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    models = [(resnet18, "resnet18.pt"), (RowGru, "gru.pt"), (RowTransformer, "transformer.pt"), (Mlp, "mlp.pt"),
              (lambda: Mlp(log_softmax=True), "mlp_logsoftmax.pt"), (Regression, "regression.pt")]
    if args.test_models:
        models += [(NoParameters, "no_parameters.pt"), (lambda: nn.Sequential(nn.Flatten(), nn.Linear(784, 5)),
                                                        "five_logits.pt")]
    for make, name in models:
        torch.manual_seed(0)  # each model's weights depend only on its own construction
        path = os.path.join(args.out, name)
        torch.jit.script(make()).save(path)
        print(path)
    if args.test_models:
        torch.manual_seed(0)
        path = os.path.join(args.out, "state_dict.pt")
        torch.save(Mlp().state_dict(), path)
        print(path)


if __name__ == "__main__":
    main()
