# One image for the learner and the actors (launch/README.md, "The image").
#
#   docker build -t seedq .                                          # CPU: actors, CPU learners
#   docker build --build-arg JAX_EXTRA='jax[cuda12]' -t seedq:gpu .   # GPU learner
#   docker build --build-arg JAX_EXTRA='jax[tpu]' -t seedq:tpu .      # TPU learner
#
# It installs seedq with the same two commands as launch/README.md: `pip install .`,
# then the accelerator's JAX build. Actors never import JAX, so one image serves both.
FROM python:3.11-slim

ARG JAX_EXTRA=""
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/seedq
COPY pyproject.toml README.md ./
COPY seedq ./seedq
RUN pip install . \
 && if [ -n "$JAX_EXTRA" ]; then pip install -U "$JAX_EXTRA"; fi \
 && rm -rf /opt/seedq/seedq /opt/seedq/build

# The manifests of `seedq launch k8s` run pods as uid/gid 1000 (fsGroup makes
# the mounted Secrets and the run volume readable to this user).
RUN groupadd --gid 1000 seedq && useradd --uid 1000 --gid 1000 --create-home seedq
USER 1000:1000
WORKDIR /home/seedq
ENTRYPOINT []
CMD ["seedq", "--help"]
