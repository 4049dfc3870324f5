# One image for every service of docker-compose.yml: the API server, the migration, the HPO controller and the
# Dask scheduler/worker. The base image brings a CUDA build of PyTorch, which the install keeps (pyproject.toml
# admits any torch >= 2.4); on a machine without GPUs the same image runs on CPU.
ARG BASE_IMAGE=pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime
FROM ${BASE_IMAGE}

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    HPO_HOME=/var/lib/hpo

WORKDIR /app
# Dependencies first, so a code change does not reinstall them.
COPY pyproject.toml README.md ./
RUN mkdir -p trainer hpo search_spaces server && touch trainer/__init__.py hpo/__init__.py \
      search_spaces/__init__.py server/__init__.py \
 && pip install . && pip uninstall -y bert-hpo
COPY trainer trainer
COPY search_spaces search_spaces
COPY hpo hpo
COPY server server
# NNI 3.0's manager mixes up trials' parameters: the engine refuses it unpatched (as `make setup` does, patch it).
RUN pip install --no-deps . && python -m hpo.nni.patch && mkdir -p /app/runs /app/data "$HPO_HOME"

# The API; `hpo serve` binds 127.0.0.1 unless told otherwise, so compose passes --host 0.0.0.0.
EXPOSE 8000
CMD ["hpo", "serve", "--host", "0.0.0.0", "--port", "8000"]
