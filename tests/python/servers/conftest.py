"""The world of test_servers.py: 2 workers and 1 parameter server (mpirun -np 3).

hvd.init(servers=1) runs when pytest loads this conftest, before it collects anything: on the
last rank, the server, init() serves until the workers shut down and then exits the process with
status 0 (SystemExit raised while pytest loads its initial conftests ends pytest quietly with that
status, where a SystemExit from a test module would be reported as a collection error). The
workers return from init() and go on to collect and run the tests.
"""
import torch

import pipesgd.torch as hvd

torch.set_num_threads(1)
hvd.init(servers=1, timeout=60)
