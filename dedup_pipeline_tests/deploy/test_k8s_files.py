"""The Kubernetes files hang together: deploy/helm/values.yaml, deploy/k8s/*.yaml, the Dockerfile, pyproject.toml.

No cluster, container engine or project dependency is needed: the files are parsed (PyYAML, tomllib), and each
link between them is a function of the parsed files that returns what is broken, in words. The tests assert that
each returns nothing for the files as they are, and, on mutated copies, that each catches the break it is about.

What the functions know of the chart (dagster/dagster 1.13) and of dagster-k8s:
- the code location (`dagster-user-deployments.deployments[]`) gets envFrom its `envConfigMaps`, then its
  `envSecrets`, plus its `env`, `volumes` and `volumeMounts`; it serves `dagster api grpc <dagsterApiGrpcArgs>`;
- a run pod is built by K8sRunLauncher from `runLauncher.config.k8sRunLauncher` (`envConfigMaps`, `envSecrets`,
  `volumes`, `volumeMounts`, `runK8sConfig`), in the code location's image unless the launcher names one; with
  `includeConfigInLaunchedRuns` enabled (the chart's default) it would also get a copy of the code location's;
- a custom run coordinator is rendered as `module`/`class`/`config` only, and `concurrency` as the instance's
  `concurrency:` block (camelCase to snake_case); `runRetries.retryOnAssetOrOpFailure` defaults to true.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"

#: What every pod that runs the pipeline's code reads from the pipeline's Secret (deploy/README.md).
SECRET_VARS = ("DEDUP_DATABASE_URL", "DEDUP_REDIS_URL", "DEDUP_TOMBSTONE_KEY", "DEDUP_CELERY_BROKER_URL")
LANDING_VAR = "DEDUP_LANDING_DIR"
QUEUE_VAR = "DEDUP_CELERY_QUEUE"
QUEUE_REF = f"$({QUEUE_VAR})"
#: Mapping keys that would name a celery queue somewhere else than the pipeline's ConfigMap.
QUEUE_KEYS = {"queue", "queues", "workerQueues", "task_default_queue", "dagster-celery/queue"}
#: The chart's instance keys that `additionalInstanceConfig` must not repeat (they would be rendered twice).
CHART_RENDERED_KEYS = ("concurrency", "run_coordinator", "run_retries", "run_monitoring", "run_launcher")


@dataclass(frozen=True)
class Files:
    values: dict
    manifests: dict[str, list[dict]]  # deploy/k8s file name -> its documents
    instance: dict  # deploy/dagster.yaml
    dockerfile: str
    dockerignore: str
    pyproject: dict
    readme: str  # deploy/README.md


def load_files() -> Files:
    manifests = {
        path.name: [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
        for path in sorted((DEPLOY / "k8s").glob("*.yaml"))
    }
    return Files(
        values=yaml.safe_load((DEPLOY / "helm" / "values.yaml").read_text()),
        manifests=manifests,
        instance=yaml.safe_load((DEPLOY / "dagster.yaml").read_text()),
        dockerfile=(ROOT / "Dockerfile").read_text(),
        dockerignore=(ROOT / ".dockerignore").read_text(),
        pyproject=tomllib.loads((ROOT / "pyproject.toml").read_text()),
        readme=(DEPLOY / "README.md").read_text(),
    )


FILES = load_files()


# --- the pods, as the chart, dagster-k8s and the manifests make them ------------------------------------------------


@dataclass
class Pod:
    where: str
    image: str | None
    env: list[dict]  # explicit env entries, in order
    env_from: list[tuple[str, str]]  # ("configmap" | "secret", name), in order (a later source wins)
    mounts: list[dict]
    volumes: list[dict]
    command: list[str]


def _names(refs: list[dict] | None) -> list[str]:
    return [ref["name"] for ref in refs or [] if ref and ref.get("name")]


def _env_list(env: dict | list | None) -> list[dict]:
    if isinstance(env, dict):  # the chart also takes a map (written to a ConfigMap)
        return [{"name": key, "value": value} for key, value in env.items()]
    return list(env or [])


def image_name(spec: dict | None) -> str | None:
    return f"{spec.get('repository')}:{spec.get('tag')}" if spec else None


def user_deployments(values: dict) -> list[dict]:
    return values.get("dagster-user-deployments", {}).get("deployments") or []


def launcher(values: dict) -> dict:
    return values.get("runLauncher", {}).get("config", {}).get("k8sRunLauncher") or {}


def custom_coordinator(values: dict) -> dict:
    coordinator = values.get("dagsterDaemon", {}).get("runCoordinator") or {}
    return (coordinator.get("config") or {}).get("customRunCoordinator") or {}


def code_location_pod(values: dict) -> Pod:
    [deployment] = user_deployments(values)  # the project is one code location
    return Pod(
        where=f"the code location (values: dagster-user-deployments {deployment['name']})",
        image=image_name(deployment.get("image")),
        env=_env_list(deployment.get("env")),
        env_from=[("configmap", name) for name in _names(deployment.get("envConfigMaps"))]
        + [("secret", name) for name in _names(deployment.get("envSecrets"))],
        mounts=list(deployment.get("volumeMounts") or []),
        volumes=list(deployment.get("volumes") or []),
        command=["dagster", "api", "grpc", *(deployment.get("dagsterApiGrpcArgs") or [])],
    )


def run_pod(values: dict) -> Pod:
    config = launcher(values)
    run_k8s = config.get("runK8sConfig") or {}
    container = run_k8s.get("containerConfig") or {}
    pod_spec = run_k8s.get("podSpecConfig") or {}
    env_vars = [
        dict(zip(("name", "value"), item.split("=", 1), strict=True))
        for item in config.get("envVars") or []
        if "=" in item
    ]
    return Pod(
        where="the run pods (values: runLauncher.config.k8sRunLauncher)",
        image=image_name(config.get("image")) or code_location_pod(values).image,
        env=env_vars + _env_list(container.get("env")),
        env_from=[("configmap", name) for name in _names(config.get("envConfigMaps"))]
        + [("secret", name) for name in _names(config.get("envSecrets"))],
        mounts=list(config.get("volumeMounts") or []) + list(container.get("volumeMounts") or []),
        volumes=list(config.get("volumes") or []) + list(pod_spec.get("volumes") or []),
        command=[],
    )


def chart_pod(values: dict, key: str, label: str) -> Pod:
    section = values.get(key) or {}
    return Pod(
        where=f"the {label} (values: {key})",
        image=image_name(section.get("image")),
        env=_env_list(section.get("env")),
        env_from=[("configmap", name) for name in _names(section.get("envConfigMaps"))]
        + [("secret", name) for name in _names(section.get("envSecrets"))],
        mounts=list(section.get("volumeMounts") or []),
        volumes=list(section.get("volumes") or []),
        command=[],
    )


def manifest_docs(files: Files, kind: str) -> Iterator[tuple[str, dict]]:
    for name, docs in files.manifests.items():
        for doc in docs:
            if doc.get("kind") == kind:
                yield name, doc


def manifest_pods(files: Files) -> dict[str, Pod]:
    pods = {}
    for file_name, doc in manifest_docs(files, "Deployment"):
        spec = doc["spec"]["template"]["spec"]
        [container] = spec["containers"]
        env_from = []
        for source in container.get("envFrom") or []:
            if "configMapRef" in source:
                env_from.append(("configmap", source["configMapRef"]["name"]))
            if "secretRef" in source:
                env_from.append(("secret", source["secretRef"]["name"]))
        pods[doc["metadata"]["name"]] = Pod(
            where=f"{doc['metadata']['name']} (deploy/k8s/{file_name})",
            image=container.get("image"),
            env=list(container.get("env") or []),
            env_from=env_from,
            mounts=list(container.get("volumeMounts") or []),
            volumes=list(spec.get("volumes") or []),
            command=[*(container.get("command") or []), *(container.get("args") or [])],
        )
    return pods


def celery_worker_pods(files: Files) -> dict[str, Pod]:
    return {
        name: pod
        for name, pod in manifest_pods(files).items()
        if pod.command[:1] == ["celery"] and "worker" in pod.command
    }


def pipeline_pods(files: Files) -> dict[str, Pod]:
    """The pods that run the pipeline's steps or its landing sensor: they read the batch files and the stores."""
    return {
        "code location": code_location_pod(files.values),
        "run pods": run_pod(files.values),
        **celery_worker_pods(files),
    }


def all_pods(files: Files) -> dict[str, Pod]:
    return {
        **pipeline_pods(files),
        "webserver": chart_pod(files.values, "dagsterWebserver", "webserver"),
        "daemon": chart_pod(files.values, "dagsterDaemon", "daemon"),
        **manifest_pods(files),
    }


def config_maps(files: Files) -> dict[str, dict]:
    return {doc["metadata"]["name"]: doc.get("data") or {} for _, doc in manifest_docs(files, "ConfigMap")}


def documented_secrets(readme: str) -> dict[str, set[str]]:
    """The Secrets deploy/README.md creates: `kubectl create secret generic NAME --from-literal=KEY=...`."""
    secrets: dict[str, set[str]] = {}
    for line in readme.replace("\\\n", " ").splitlines():
        match = re.search(r"create secret generic\s+([a-z0-9.-]+)", line)
        if match:
            keys = re.findall(r"--from-(?:literal|file)=([A-Za-z0-9_.-]+)=", line)
            secrets.setdefault(match.group(1), set()).update(keys)
    return secrets


def env_source(pod: Pod, name: str, files: Files) -> tuple | None:
    """Where `name` comes from in `pod`, as Kubernetes resolves it (an explicit entry wins over envFrom, and a later
    envFrom source over an earlier one): ("value", v), ("configmap", map, key, v), ("secret", secret, key), or None."""
    for entry in reversed(pod.env):
        if entry.get("name") != name:
            continue
        if "value" in entry:
            return ("value", entry["value"])
        ref = entry.get("valueFrom") or {}
        if "configMapKeyRef" in ref:
            cm = ref["configMapKeyRef"]
            return ("configmap", cm["name"], cm["key"], config_maps(files).get(cm["name"], {}).get(cm["key"]))
        if "secretKeyRef" in ref:
            return ("secret", ref["secretKeyRef"]["name"], ref["secretKeyRef"]["key"])
        return ("unknown", ref)
    maps, secrets = config_maps(files), documented_secrets(files.readme)
    for kind, source in reversed(pod.env_from):
        if kind == "configmap" and name in maps.get(source, {}):
            return ("configmap", source, name, maps[source][name])
        if kind == "secret" and name in secrets.get(source, set()):
            return ("secret", source, name)
    return None


def resolved_value(source: tuple | None) -> Any:
    if source and source[0] == "value":
        return source[1]
    if source and source[0] == "configmap":
        return source[3]
    return None


# --- the links --------------------------------------------------------------------------------------------------------


def landing_problems(files: Files) -> list[str]:
    """Every pod that reads batch files mounts the one ReadWriteMany claim the same way, at DEDUP_LANDING_DIR."""
    problems = []
    claims = {doc["metadata"]["name"]: doc["spec"] for _, doc in manifest_docs(files, "PersistentVolumeClaim")}
    if len(claims) != 1:
        return [f"deploy/k8s/ defines {len(claims)} PersistentVolumeClaims, expected the landing claim alone"]
    [(claim, claim_spec)] = claims.items()
    if "ReadWriteMany" not in (claim_spec.get("accessModes") or []):
        problems.append(f"claim {claim} is not ReadWriteMany: the crawlers and pods on several nodes use it at once")
    declarations = {}
    for pod in pipeline_pods(files).values():
        volumes = [v for v in pod.volumes if (v.get("persistentVolumeClaim") or {}).get("claimName") == claim]
        if len(volumes) != 1:
            problems.append(f"{pod.where} has {len(volumes)} volumes of claim {claim}, expected 1")
            continue
        mounts = [m for m in pod.mounts if m.get("name") == volumes[0]["name"]]
        if len(mounts) != 1:
            problems.append(f"{pod.where} mounts its landing volume {len(mounts)} times, expected 1")
            continue
        declarations[pod.where] = {key: mounts[0].get(key) for key in ("mountPath", "subPath", "readOnly")}
        landing = resolved_value(env_source(pod, LANDING_VAR, files))
        if landing != mounts[0].get("mountPath"):
            problems.append(
                f"{pod.where}: {LANDING_VAR} is {landing!r}, "
                f"but the landing volume is mounted at {mounts[0].get('mountPath')!r}"
            )
    if len({json.dumps(d, sort_keys=True) for d in declarations.values()}) > 1:
        problems.append(f"the landing volume is not mounted the same way everywhere: {declarations}")
    return problems


def launched_run_problems(files: Files) -> list[str]:
    """Run pods are K8sRunLauncher Jobs with their own settings, in the code location's image."""
    problems = []
    if files.values.get("runLauncher", {}).get("type") != "K8sRunLauncher":
        problems.append("runLauncher.type is not K8sRunLauncher")
    for deployment in user_deployments(files.values):
        if (deployment.get("includeConfigInLaunchedRuns") or {}).get("enabled", True) is not False:
            problems.append(
                f"user deployment {deployment['name']}: includeConfigInLaunchedRuns is not disabled, so run pods get a "
                "copy of the code server's settings, whose resources replace the run launcher's"
            )
    if launcher(files.values).get("image"):
        problems.append("runLauncher names an image: run pods must start from the code location's image")
    return problems


def image_problems(files: Files) -> list[str]:
    """One image, registry.example.com/dedup-pipeline:<tag>, in every pod that runs the project's code."""
    match = re.search(r"docker build -t (\S+):\S+ \.", files.dockerfile)
    if not match:
        return ["the Dockerfile does not document its image name (`docker build -t <repository>:<tag> .`)"]
    repository = match.group(1)
    problems, tags = [], {}
    for pod in all_pods(files).values():
        name, _, tag = (pod.image or "").rpartition(":")
        if name != repository:
            problems.append(f"{pod.where} runs image {pod.image!r}, not the Dockerfile's {repository}")
            continue
        tags[pod.where] = tag
        if tag in ("", "latest"):
            problems.append(f"{pod.where} runs {pod.image!r}: name a release tag, never latest")
    if len(set(tags.values())) > 1:
        problems.append(f"the image's tag differs between the files: {tags}")
    return problems


def secret_problems(files: Files) -> list[str]:
    """The pipeline's Secret: documented with its keys, and where every pod that runs steps or the sensor reads them."""
    problems = []
    documented = documented_secrets(files.readme)
    code_location_secrets = [name for kind, name in code_location_pod(files.values).env_from if kind == "secret"]
    if len(code_location_secrets) != 1:
        return [f"the code location reads {len(code_location_secrets)} Secrets, expected the pipeline's alone"]
    [secret] = code_location_secrets
    missing = set(SECRET_VARS) - documented.get(secret, set())
    if missing:
        problems.append(f"deploy/README.md does not create Secret {secret} with {sorted(missing)}")
    for key in documented.get(secret, set()) & {key for data in config_maps(files).values() for key in data}:
        problems.append(
            f"{key} is in Secret {secret} and in a ConfigMap: which one a pod sees depends on the envFrom order"
        )
    for pod in pipeline_pods(files).values():
        for var in SECRET_VARS:
            source = env_source(pod, var, files)
            if source != ("secret", secret, var):
                problems.append(f"{pod.where}: {var} does not come from Secret {secret} (but from {source})")
    for pod in all_pods(files).values():  # every Secret a pod names is one the operator is told to create, key and all
        for kind, name in pod.env_from:
            if kind == "secret" and name not in documented:
                problems.append(f"{pod.where} reads Secret {name}, which deploy/README.md does not create")
        for entry in pod.env:
            ref = (entry.get("valueFrom") or {}).get("secretKeyRef")
            if ref and ref["key"] not in documented.get(ref["name"], set()):
                problems.append(
                    f"{pod.where} reads key {ref['key']} of Secret {ref['name']}, "
                    "which deploy/README.md does not create"
                )
    pg_secret = files.values.get("global", {}).get("postgresqlSecretName")
    for pod in celery_worker_pods(files).values():  # the chart's own pods get DAGSTER_PG_PASSWORD from the chart
        if env_source(pod, "DAGSTER_PG_PASSWORD", files) != ("secret", pg_secret, "postgresql-password"):
            problems.append(
                f"{pod.where} does not read DAGSTER_PG_PASSWORD from {pg_secret} (global.postgresqlSecretName)"
            )
    return problems


def render_concurrency(concurrency: dict) -> dict:
    """The instance's `concurrency:` block that the chart renders from its `concurrency` values."""
    rendered: dict[str, dict] = {}
    pools = concurrency.get("pools") or {}
    names = (
        ("defaultLimit", "default_limit"),
        ("granularity", "granularity"),
        ("opGranularityRunBuffer", "op_granularity_run_buffer"),
    )
    if any(pools.get(camel) is not None for camel, _ in names):
        rendered["pools"] = {snake: pools[camel] for camel, snake in names if pools.get(camel) is not None}
    runs = concurrency.get("runs") or {}
    if runs.get("maxConcurrentRuns") is not None or runs.get("tagConcurrencyLimits"):
        rendered["runs"] = {}
        if runs.get("maxConcurrentRuns") is not None:
            rendered["runs"]["max_concurrent_runs"] = runs["maxConcurrentRuns"]
        if runs.get("tagConcurrencyLimits"):
            rendered["runs"]["tag_concurrency_limits"] = [
                {key: limit[key] for key in ("key", "value", "limit") if limit.get(key)}
                for limit in runs["tagConcurrencyLimits"]
            ]
    return rendered


def limit_problems(files: Files) -> list[str]:
    """The run coordinator and the run and pool limits are deploy/dagster.yaml's."""
    problems = []
    values, instance = files.values, files.instance
    concurrency = values.get("concurrency") or {}
    if not concurrency.get("enabled"):
        problems.append("concurrency.enabled is not true: the chart renders no concurrency block")
    rendered = render_concurrency(concurrency)
    if rendered != instance.get("concurrency"):
        problems.append(
            f"the chart's concurrency renders {rendered}, deploy/dagster.yaml has {instance.get('concurrency')}"
        )
    coordinator = values.get("dagsterDaemon", {}).get("runCoordinator") or {}
    if not coordinator.get("enabled") or coordinator.get("type") != "CustomRunCoordinator":
        problems.append(
            "dagsterDaemon.runCoordinator is not an enabled CustomRunCoordinator: "
            "runs launched from the UI or a backfill get no lane tag"
        )
    custom = custom_coordinator(values)
    expected = instance.get("run_coordinator") or {}
    chart_class, instance_class = (f"{c.get('module')}.{c.get('class')}" for c in (custom, expected))
    if chart_class != instance_class:
        problems.append(f"the chart's run coordinator is {chart_class}, deploy/dagster.yaml's {instance_class}")
    if {"max_concurrent_runs", "tag_concurrency_limits"} & set(custom.get("config") or {}):
        problems.append(
            "customRunCoordinator.config carries run limits: "
            "they belong to the chart's concurrency values, as in deploy/dagster.yaml"
        )
    queued = (coordinator.get("config") or {}).get("queuedRunCoordinator") or {}
    if queued.get("maxConcurrentRuns") is not None or queued.get("tagConcurrencyLimits"):
        problems.append(
            "queuedRunCoordinator carries run limits, which the chart does not render for a CustomRunCoordinator"
        )
    for key in CHART_RENDERED_KEYS:
        if key in (values.get("additionalInstanceConfig") or {}):
            problems.append(f"additionalInstanceConfig.{key} repeats a block the chart renders itself")
    return problems


def retry_problems(files: Files) -> list[str]:
    """Run retries retry whole runs whose pod died, never a failed step (the assets' RetryPolicy retries those)."""
    problems = []
    retries = files.values.get("dagsterDaemon", {}).get("runRetries") or {}
    intended = files.instance.get("run_retries") or {}
    if intended.get("retry_on_asset_or_op_failure", True) is not False:
        problems.append("deploy/dagster.yaml retries runs whose step failed")
    chart = {
        "enabled": retries.get("enabled", False),
        "max_retries": retries.get("maxRetries", 0),
        "retry_on_asset_or_op_failure": retries.get("retryOnAssetOrOpFailure", True),  # the chart's default
    }
    instance = {
        "enabled": intended.get("enabled", False),
        "max_retries": intended.get("max_retries", 0),
        "retry_on_asset_or_op_failure": intended.get("retry_on_asset_or_op_failure", True),
    }
    if chart != instance:
        problems.append(f"dagsterDaemon.runRetries gives {chart}, deploy/dagster.yaml {instance}")
    return problems


def monitoring_problems(files: Files) -> list[str]:
    monitoring = files.values.get("dagsterDaemon", {}).get("runMonitoring") or {}
    intended = files.instance.get("run_monitoring") or {}
    chart = (monitoring.get("enabled"), monitoring.get("startTimeoutSeconds"), monitoring.get("pollIntervalSeconds"))
    instance = (intended.get("enabled"), intended.get("start_timeout_seconds"), intended.get("poll_interval_seconds"))
    return [] if chart == instance else [f"dagsterDaemon.runMonitoring gives {chart}, deploy/dagster.yaml {instance}"]


def _walk(node: Any, path: str) -> Iterator[tuple[str, Any]]:
    yield path, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _walk(value, f"{path}[{index}]")


def queue_problems(files: Files) -> list[str]:
    """The celery queue is named once, in a ConfigMap, and every pod that puts or takes steps reads it from there."""
    problems = []
    named = [(name, data[QUEUE_VAR]) for name, data in config_maps(files).items() if QUEUE_VAR in data]
    if len(named) != 1:
        return [f"{len(named)} ConfigMaps name {QUEUE_VAR}, expected 1"]
    [(queue_map, queue)] = named
    trees = [("values", files.values), ("deploy/dagster.yaml", files.instance)]
    trees += [(f"deploy/k8s/{name}", doc) for name, docs in files.manifests.items() for doc in docs]
    for where, tree in trees:
        for path, node in _walk(tree, where):
            if isinstance(node, dict):
                for key in QUEUE_KEYS & set(node):
                    problems.append(f"{path}.{key} names a queue outside ConfigMap {queue_map}")
                if node.get("name") == QUEUE_VAR and "value" in node:
                    problems.append(f"{path} sets {QUEUE_VAR} to the literal {node['value']!r}")
            if isinstance(node, list) and all(isinstance(item, str) for item in node):
                for index, item in enumerate(node):
                    if item in ("-Q", "--queues") and node[index + 1 : index + 2] != [QUEUE_REF]:
                        problems.append(f"{path}: {item} {node[index + 1 : index + 2]}, not {QUEUE_REF}")
                    if (
                        item.startswith(("-Q", "--queues="))
                        and item not in ("-Q", "--queues")
                        and QUEUE_REF not in item
                    ):
                        problems.append(f"{path}: {item!r} names a queue literally")
    if files.values.get("runLauncher", {}).get("type") == "CeleryK8sRunLauncher":
        problems.append("the chart's CeleryK8sRunLauncher names its own worker queues")
    for pod in pipeline_pods(files).values():
        source = env_source(pod, QUEUE_VAR, files)
        if source is None or source[0] != "configmap" or source[1] != queue_map:
            problems.append(f"{pod.where}: {QUEUE_VAR} does not come from ConfigMap {queue_map} (but from {source})")
        if any(QUEUE_REF in part for part in pod.command) and not any(
            entry.get("name") == QUEUE_VAR for entry in pod.env
        ):
            problems.append(
                f"{pod.where} expands {QUEUE_REF} without an env entry for it "
                "(a missing key would leave the literal text)"
            )
    if not queue:
        problems.append(f"ConfigMap {queue_map} names an empty queue")
    return problems


def _instructions(dockerfile: str) -> list[tuple[str, str]]:
    text = re.sub(
        r"\\\n", " ", "\n".join(line for line in dockerfile.splitlines() if not line.lstrip().startswith("#"))
    )
    return [
        (line.split(None, 1)[0].upper(), (line.split(None, 1) + [""])[1].strip())
        for line in text.splitlines()
        if line.strip()
    ]


def dockerfile_problems(files: Files) -> list[str]:
    """python:3.11-slim, the project with its k8s extra and nothing else, a non-root user, `dagster api grpc` as CMD."""
    problems = []
    instructions = _instructions(files.dockerfile)
    froms = [args for op, args in instructions if op == "FROM"]
    if froms != ["python:3.11-slim"]:
        problems.append(f"the image is built FROM {froms}, expected python:3.11-slim")
    installs = [i for i, (op, args) in enumerate(instructions) if op == "RUN" and "pip install" in args]
    extras = [extra for i in installs for extra in re.findall(r"\.\[([^\]]*)\]", instructions[i][1])]
    if extras != ["k8s"]:
        problems.append(f"the Dockerfile installs the project with extras {extras}, expected .[k8s] once")
    if any(re.search(r"\s(-e|--editable)\s", instructions[i][1]) for i in installs):
        problems.append("the Dockerfile installs the project editable (its sources must not be needed at run time)")
    users = [(i, args) for i, (op, args) in enumerate(instructions) if op == "USER"]
    if not users or users[-1][1].split(":")[0] in ("root", "0"):
        problems.append("the image runs as root: end with a USER that is not root")
    elif installs and users[-1][0] < installs[-1]:
        problems.append("the last pip install runs after USER")
    if any(op == "ENTRYPOINT" for op, _ in instructions):
        problems.append(
            "the image has an ENTRYPOINT: the chart's args ('dagster api grpc ...') would be appended to it"
        )
    cmds = [args for op, args in instructions if op == "CMD"]
    cmd = json.loads(cmds[-1]) if cmds and cmds[-1].startswith("[") else None
    grpc_args = code_location_pod(files.values).command
    module = files.pyproject.get("tool", {}).get("dagster", {}).get("module_name")
    if not cmd or cmd[:3] != ["dagster", "api", "grpc"]:
        problems.append(f"the image's CMD is {cmds[-1:]}, expected an exec-form dagster api grpc")
    elif _option(cmd, "-m") != module or _option(grpc_args, "-m") != module:
        problems.append(
            f"the CMD serves {_option(cmd, '-m')}, the chart {_option(grpc_args, '-m')}, "
            f"pyproject's code location is {module}"
        )
    env = dict(pair.split("=", 1) for op, args in instructions if op == "ENV" for pair in args.split() if "=" in pair)
    dagster_home = files.values.get("global", {}).get("dagsterHome")
    if env.get("DAGSTER_HOME") != dagster_home:
        problems.append(
            f"the image's DAGSTER_HOME is {env.get('DAGSTER_HOME')!r}, the chart's global.dagsterHome {dagster_home!r}"
        )
    for pod in all_pods(files).values():
        home = resolved_value(env_source(pod, "DAGSTER_HOME", files))
        if home is not None and home != dagster_home:
            problems.append(f"{pod.where} sets DAGSTER_HOME to {home!r}, not {dagster_home!r}")
    ignored = [line.strip() for line in files.dockerignore.splitlines() if line.strip() and not line.startswith("#")]
    if ignored[:1] != ["*"]:
        problems.append(".dockerignore does not start with '*': the build context would carry local state and keys")
    for op, args in instructions:
        if op == "COPY" and not args.startswith("--from"):
            for source in args.split()[:-1]:
                if not (ROOT / source).exists():
                    problems.append(f"the Dockerfile copies {source}, which is not in the repository")
                elif f"!{source}" not in ignored and f"!{source}/" not in ignored:
                    problems.append(
                        f"the Dockerfile copies {source}, which .dockerignore leaves out of the build context"
                    )
    return problems


def _option(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args[:-1] else None


def _pins(requirements: list[str]) -> dict[str, str]:
    return dict(requirement.split("==", 1) for requirement in requirements if "==" in requirement)


def pyproject_problems(files: Files) -> list[str]:
    """The k8s extra pins dagster-k8s at the library release of the pinned dagster (1.X.Y goes with 0.(X+16).Y)."""
    project = files.pyproject["project"]
    pins = _pins(project["dependencies"])
    _, minor, patch = pins["dagster"].split(".")
    library = f"0.{int(minor) + 16}.{patch}"
    problems = []
    extra = project.get("optional-dependencies", {}).get("k8s")
    if extra != [f"dagster-k8s=={library}"]:
        problems.append(f"the k8s extra is {extra}, expected ['dagster-k8s=={library}'] (dagster {pins['dagster']})")
    for name in ("dagster-postgres", "dagster-celery"):
        if pins.get(name) != library:
            problems.append(
                f"{name} is pinned at {pins.get(name)}, not {library}, the release of dagster {pins['dagster']}"
            )
    return problems


def _module_exists(module: str) -> bool:
    path = ROOT.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def code_problems(files: Files) -> list[str]:
    """The Python modules and environment variables the deploy files name exist in the package."""
    modules = {
        "values: dagsterApiGrpcArgs": _option(code_location_pod(files.values).command, "-m"),
        "values: customRunCoordinator": custom_coordinator(files.values).get("module"),
    }
    for pod in manifest_pods(files).values():
        if pod.command[:1] == ["celery"]:
            modules[pod.where] = _option(pod.command, "-A")
    problems = [
        f"{where} names module {module}, which is not in the package"
        for where, module in modules.items()
        if not module or not _module_exists(module)
    ]
    source = "\n".join(path.read_text() for path in (ROOT / "dedup_pipeline").rglob("*.py"))
    variables = {LANDING_VAR, QUEUE_VAR, *SECRET_VARS, *(key for data in config_maps(files).values() for key in data)}
    problems += [
        f"the deploy files set {var}, which the package never reads"
        for var in sorted(variables)
        if f'"{var}"' not in source
    ]
    return problems


CHECKS: dict[str, Callable[[Files], list[str]]] = {
    "landing": landing_problems,
    "launched runs": launched_run_problems,
    "image": image_problems,
    "secrets": secret_problems,
    "limits": limit_problems,
    "retries": retry_problems,
    "monitoring": monitoring_problems,
    "queue": queue_problems,
    "dockerfile": dockerfile_problems,
    "pyproject": pyproject_problems,
    "code": code_problems,
}


@pytest.mark.parametrize("check", CHECKS.values(), ids=CHECKS.keys())
def test_the_files_hang_together(check):
    assert check(FILES) == []


def test_the_pods_are_found():
    """The checks look at the pods they mean to (a pod they could not find would pass them all)."""
    pods = all_pods(FILES)
    assert set(pipeline_pods(FILES)) == {"code location", "run pods", "dedup-celery-workers"}
    assert {"webserver", "daemon", "dedup-metrics"} <= set(pods)
    assert all(pod.image for pod in pods.values())
    assert set(documented_secrets(FILES.readme)) >= {
        "dagster-postgresql-secret",
        "dedup-pipeline-env",
        "dedup-metrics-db",
    }
    assert resolved_value(env_source(pods["run pods"], LANDING_VAR, FILES)) == "/data/landing"


# --- each check catches the break it is about -------------------------------------------------------------------------


def _celery(files: Files) -> dict:
    [doc] = [doc for _, doc in manifest_docs(files, "Deployment") if doc["metadata"]["name"] == "dedup-celery-workers"]
    return doc["spec"]["template"]["spec"]["containers"][0]


def _config_map(files: Files) -> dict:
    [doc] = [doc for _, doc in manifest_docs(files, "ConfigMap")]
    return doc["data"]


def _code_location(files: Files) -> dict:
    return user_deployments(files.values)[0]


def _daemon(files: Files) -> dict:
    return files.values["dagsterDaemon"]


def _text(field: str, old: str, new: str) -> Callable[[Files], Files]:
    def mutate(files: Files) -> Files:
        text = getattr(files, field)
        assert old in text
        return dataclasses.replace(files, **{field: text.replace(old, new)})

    return mutate


def _edit(change: Callable[[Files], None]) -> Callable[[Files], Files]:
    def mutate(files: Files) -> Files:
        change(files)
        return files

    return mutate


BREAKS = {
    "a celery worker mounts the landing volume elsewhere": (
        _edit(lambda f: _celery(f)["volumeMounts"][0].update(mountPath="/mnt/landing")),
        landing_problems,
        "DEDUP_LANDING_DIR is '/data/landing'",
    ),
    "the code location does not mount the landing volume": (
        _edit(lambda f: _code_location(f).pop("volumeMounts")),
        landing_problems,
        "mounts its landing volume 0 times",
    ),
    "DEDUP_LANDING_DIR names another folder": (
        _edit(lambda f: _config_map(f).update(DEDUP_LANDING_DIR="/data/incoming")),
        landing_problems,
        "'/data/incoming'",
    ),
    "the run pods mount the landing volume writable": (
        _edit(lambda f: launcher(f.values)["volumeMounts"][0].update(readOnly=False)),
        landing_problems,
        "not mounted the same way",
    ),
    "run pods get a copy of the code server's settings": (
        _edit(lambda f: _code_location(f).pop("includeConfigInLaunchedRuns")),
        launched_run_problems,
        "includeConfigInLaunchedRuns",
    ),
    "the celery workers run an older tag": (
        _edit(lambda f: _celery(f).update(image="registry.example.com/dedup-pipeline:0.0.9")),
        image_problems,
        "tag differs",
    ),
    "the webserver runs the chart's image": (
        _edit(
            lambda f: f.values["dagsterWebserver"].update(
                image={"repository": "docker.io/dagster/dagster-celery-k8s", "tag": "1.13.27"}
            )
        ),
        image_problems,
        "the webserver (values: dagsterWebserver) runs image 'docker.io/dagster",
    ),
    "the Dockerfile documents another repository": (
        _text("dockerfile", "docker build -t registry.example.com/", "docker build -t ghcr.io/"),
        image_problems,
        "not the Dockerfile's ghcr.io",
    ),
    "the celery workers read another Secret": (
        _edit(lambda f: _celery(f)["envFrom"][1]["secretRef"].update(name="dedup-env")),
        secret_problems,
        "does not come from Secret dedup-pipeline-env",
    ),
    "the README creates the Secret without the tombstone key": (
        _text("readme", "--from-literal=DEDUP_TOMBSTONE_KEY=", "--from-literal=TOMBSTONE_KEY="),
        secret_problems,
        "DEDUP_TOMBSTONE_KEY",
    ),
    "a tag limit differs from deploy/dagster.yaml": (
        _edit(lambda f: f.values["concurrency"]["runs"]["tagConcurrencyLimits"][1].update(limit=2)),
        limit_problems,
        "deploy/dagster.yaml has",
    ),
    "the chart's plain queued run coordinator": (
        _edit(lambda f: _daemon(f)["runCoordinator"].update(type="QueuedRunCoordinator")),
        limit_problems,
        "no lane tag",
    ),
    "limits in additionalInstanceConfig": (
        _edit(lambda f: f.values["additionalInstanceConfig"].update(concurrency=f.instance["concurrency"])),
        limit_problems,
        "additionalInstanceConfig.concurrency",
    ),
    "Helm retries runs whose step failed (the chart's default)": (
        _edit(lambda f: _daemon(f)["runRetries"].pop("retryOnAssetOrOpFailure")),
        retry_problems,
        "'retry_on_asset_or_op_failure': True",
    ),
    "run monitoring waits longer than deploy/dagster.yaml": (
        _edit(lambda f: _daemon(f)["runMonitoring"].update(startTimeoutSeconds=900)),
        monitoring_problems,
        "runMonitoring",
    ),
    "the workers listen on a literal queue": (
        _edit(lambda f: _celery(f)["command"].__setitem__(_celery(f)["command"].index(QUEUE_REF), "dagster")),
        queue_problems,
        "not $(DEDUP_CELERY_QUEUE)",
    ),
    "the run pods set the queue literally": (
        _edit(
            lambda f: (
                launcher(f.values)
                .setdefault("runK8sConfig", {})
                .setdefault("containerConfig", {})
                .update(env=[{"name": QUEUE_VAR, "value": "dedup"}])
            )
        ),
        queue_problems,
        "literal 'dedup'",
    ),
    "the image installs the test extra": (
        _text("dockerfile", '".[k8s]"', '".[k8s,test]"'),
        dockerfile_problems,
        "extras ['k8s,test']",
    ),
    "the image runs as root": (
        _text("dockerfile", "USER 10001:10001", "USER root"),
        dockerfile_problems,
        "runs as root",
    ),
    "the image has an ENTRYPOINT": (
        _text("dockerfile", "EXPOSE 3030", 'ENTRYPOINT ["dagster"]\nEXPOSE 3030'),
        dockerfile_problems,
        "ENTRYPOINT",
    ),
    "the k8s extra pins another dagster-k8s": (
        _edit(lambda f: f.pyproject["project"]["optional-dependencies"].update(k8s=["dagster-k8s==0.29.26"])),
        pyproject_problems,
        "0.29.27",
    ),
    "the run coordinator's module moved": (
        _edit(lambda f: custom_coordinator(f.values).update(module="dedup_pipeline.coordinators")),
        code_problems,
        "dedup_pipeline.coordinators",
    ),
}


@pytest.mark.parametrize("mutate, check, expected", BREAKS.values(), ids=BREAKS.keys())
def test_each_check_catches_its_break(mutate, check, expected):
    broken = mutate(copy.deepcopy(FILES))
    problems = check(broken)
    assert any(expected in problem for problem in problems), problems
    assert check(FILES) == []  # the mutation was made on a copy
