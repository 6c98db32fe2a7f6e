# Sourced by the gpu_*.sh scripts beside it (from the repository root): OUT (default
# runs/gpu) made; the package's dependencies that the device image lacks installed from
# .whl/ (dp-accounting, dm-tree, opacus) when carried; PYTHONPATH and unbuffered output.
OUT=${OUT:-runs/gpu}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=$PWD:/tmp/site
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
