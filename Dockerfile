# The image of dedup_pipeline on Kubernetes (deploy/README.md, "Kubernetes"). One image for every pod that runs
# the project's code: the code location (the Helm chart's user deployment, where the landing sensor runs), the run
# pods (K8sRunLauncher starts each from the code location's image), the webserver and the daemon (they load
# the instance's run coordinator, dedup_pipeline.run_coordinator), the celery workers and the metrics exporter.
#
#   docker build -t registry.example.com/dedup-pipeline:<tag> .
#   docker push registry.example.com/dedup-pipeline:<tag>
#
# registry.example.com/dedup-pipeline is the repository that deploy/helm/values.yaml and deploy/k8s/*.yaml name;
# <tag> is the tag they name (a new one per release, never "latest"). Use your registry's name in all of them:
# dedup_pipeline_tests/deploy/test_k8s_files.py fails when they differ. Not built in CI here (no container engine).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    DAGSTER_HOME=/opt/dagster/dagster_home

# The project with its k8s extra (dagster-k8s beside dagster-postgres and dagster-celery), none of the test or bench
# extras; the sources are removed once installed, so the code runs from site-packages.
WORKDIR /tmp/build
COPY pyproject.toml README.md ./
COPY dedup_pipeline ./dedup_pipeline
RUN pip install ".[k8s]" && cd / && rm -rf /tmp/build

# A non-root user. DAGSTER_HOME is the chart's dagsterHome: the chart mounts its dagster.yaml there, and the instance
# writes compute logs and local artifacts beside it, so the folder belongs to this user. The home folder is the
# working directory (numba's kernel cache and the embedded defaults' .dedup folder land there when nothing else is set).
RUN groupadd --gid 10001 dedup \
    && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/dedup --shell /usr/sbin/nologin dedup \
    && mkdir -p "$DAGSTER_HOME" \
    && chown dedup:dedup "$DAGSTER_HOME"
USER 10001:10001
WORKDIR /home/dedup

# No ENTRYPOINT: the chart starts the code location with `args: [dagster, api, grpc, -h, 0.0.0.0, -p, <port>,
# <dagsterApiGrpcArgs>...]`, the run launcher its run pods with `args` too, and the manifests with `command`; each
# replaces this CMD, which serves the same code location when the image is run by hand.
EXPOSE 3030
CMD ["dagster", "api", "grpc", "-h", "0.0.0.0", "-p", "3030", "-m", "dedup_pipeline.definitions"]
