#!/usr/bin/env bash
# Installs every Debian package pipesgd needs. Idempotent: packages already present are skipped.
# Runs as root (CI, fresh machines) or through sudo when available.
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  libtorch-dev libopenblas0-openmp
  python3-torch python3-torchvision  # examples/export_models.py (TorchScript models; tests run it)
  libgtest-dev libgmock-dev googletest
  libcli11-dev nlohmann-json3-dev zlib1g-dev
  libxtensor-dev  # .npy headers (--data npy:DIR)
  python3-numpy   # tests/cli: writes the .npy fixtures
  openmpi-bin libopenmpi-dev
  dataset-fashion-mnist
  clang libclang-rt-14-dev llvm  # scripts/fuzz.sh: libFuzzer, sanitizers, llvm-symbolizer
  pybind11-dev python3-pytest     # the Python package pipesgd.torch (python/) and its tests
  libsimgrid-dev                  # pipesgd simulate / advise (src/pipesgd/sim)
  gnuplot-nox                     # pipesgd report: draws its plots as SVG (no X11)
  chromium                        # tests/report: the report page loaded and screenshotted headless
  python3-mock python3-cloudpickle  # scripts/horovod-conformance.sh: Horovod's test utils import them
  iproute2 util-linux             # scripts/local-cluster.sh: namespaces, veth, bridge, tbf; unshare
)

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages already installed"
  exit 0
fi

sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null 2>&1; then sudo_cmd=(sudo); else
    echo "install-deps: need root (or sudo) to install: ${missing[*]}" >&2; exit 1
  fi
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install-deps: done"
