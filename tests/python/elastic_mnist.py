"""Horovod's examples/elastic/pytorch/pytorch_mnist_elastic.py, in our own words, for test_elastic.py.

The structure is the example's: hvd.init(), MNIST through torchvision with DistributedSampler, the
same small CNN, SGD scaled by hvd.size() wrapped in hvd.DistributedOptimizer(named_parameters=...),
a training function decorated with @hvd.elastic.run that walks `for state.epoch in range(...)`,
trains `len(train_loader) - state.batch` batches of each epoch and commits after every batch, a
TorchState(model, optimizer, epoch=1, batch=0) with a reset callback that rescales the learning
rate, then the averaged test accuracy. Only --train-examples/--test-examples (a torch Subset of the
first N examples, to keep the test short) are ours.
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed
from torchvision import datasets, transforms

import pipesgd.torch as hvd

parser = argparse.ArgumentParser(description="elastic MNIST-format training (test_elastic.py)")
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--test-batch-size", type=int, default=1000)
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--lr", type=float, default=0.01)
parser.add_argument("--momentum", type=float, default=0.5)
parser.add_argument("--seed", type=int, default=42)
parser.add_argument("--log-interval", type=int, default=20)
parser.add_argument("--data-dir", required=True)
parser.add_argument("--train-examples", type=int, default=0, help="train on the first N examples (0: all)")
parser.add_argument("--test-examples", type=int, default=0, help="test on the first N examples (0: all)")
args = parser.parse_args()

hvd.init()
torch.manual_seed(args.seed)
torch.set_num_threads(1)

normalize = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])


def first(dataset, count):
    return torch.utils.data.Subset(dataset, range(count)) if count else dataset


# download=True finds the files in DATA_DIR/MNIST/raw and downloads nothing.
train_data = first(datasets.MNIST(args.data_dir, train=True, download=True, transform=normalize), args.train_examples)
train_sampler = torch.utils.data.distributed.DistributedSampler(train_data, num_replicas=hvd.size(), rank=hvd.rank())
train_loader = torch.utils.data.DataLoader(train_data, batch_size=args.batch_size, sampler=train_sampler)
test_data = first(datasets.MNIST(args.data_dir, train=False, transform=normalize), args.test_examples)
test_sampler = torch.utils.data.distributed.DistributedSampler(test_data, num_replicas=hvd.size(), rank=hvd.rank())
test_loader = torch.utils.data.DataLoader(test_data, batch_size=args.test_batch_size, sampler=test_sampler)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = F.relu(self.fc1(x.view(-1, 320)))
        x = F.dropout(x, training=self.training)
        return F.log_softmax(self.fc2(x), dim=1)


model = Net()
optimizer = optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=args.momentum)


def averaged(value, name):
    return hvd.allreduce(torch.tensor(value), name=name).item()


@hvd.elastic.run
def train(state):
    for state.epoch in range(state.epoch, args.epochs + 1):
        state.model.train()
        train_sampler.set_epoch(state.epoch)
        steps_remaining = len(train_loader) - state.batch
        for state.batch, (data, target) in enumerate(train_loader):
            if state.batch >= steps_remaining:
                break
            state.optimizer.zero_grad()
            loss = F.nll_loss(state.model(data), target)
            loss.backward()
            state.optimizer.step()
            if state.batch % args.log_interval == 0:
                print(f"Train Epoch: {state.epoch} [{state.batch * len(data)}/{len(train_sampler)}]\t"
                      f"Loss: {loss.item():.6f}", flush=True)
            state.commit()
        state.batch = 0


def test():
    model.eval()
    loss_sum, correct = 0.0, 0.0
    with torch.no_grad():
        for data, target in test_loader:
            output = model(data)
            loss_sum += F.nll_loss(output, target, reduction="sum").item()
            correct += output.argmax(dim=1).eq(target).float().sum().item()
    loss = averaged(loss_sum / len(test_sampler), "avg_loss")
    accuracy = averaged(correct / len(test_sampler), "avg_accuracy")
    if hvd.rank() == 0:
        print(f"\nTest set: Average loss: {loss:.4f}, Accuracy: {100.0 * accuracy:.2f}%\n", flush=True)


optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())


def on_state_reset():
    for group in optimizer.param_groups:
        group["lr"] = args.lr * hvd.size()


state = hvd.elastic.TorchState(model, optimizer, epoch=1, batch=0)
state.register_reset_callbacks([on_state_reset])
train(state)
test()
