# syntax=docker/dockerfile:1
# The nvplugin image the Helm chart (charts/nvplugin) runs:
#   docker build -t nvplugin:0.1.0 .      # the chart's default image is nvplugin:<appVersion>
# It needs no GPU to build. At run time the NVIDIA container runtime injects libnvidia-ml and the
# GPU device nodes (see NVIDIA_* below); `docker run nvplugin:0.1.0 serve --simulate dgx-a100`
# serves a simulated node anywhere (it waits for a kubelet on /var/lib/kubelet/device-plugins).
# It is also a drop-in for NVIDIA's image: a DaemonSet written for NVIDIA's plugin runs it, with
# its `nvidia-device-plugin` command or none (the entrypoint below serves).

ARG PYTHON_VERSION=3.11
FROM python:${PYTHON_VERSION}-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility \
    PATH=/opt/nvplugin/bin:$PATH

# The owner of the installed files: an unprivileged user, not root. The plugin runs as uid 0 (it
# must create its socket in the kubelet's root-owned directory and connect to kubelet.sock); the
# chart drops every capability, and without CAP_DAC_OVERRIDE/CAP_FOWNER such a root process cannot
# change files it does not own.
RUN groupadd --system --gid 10001 nvplugin \
 && useradd --system --uid 10001 --gid nvplugin --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin nvplugin

# Only what the package build reads (.dockerignore keeps everything else out of the context).
COPY pyproject.toml README.md /src/
COPY nvplugin /src/nvplugin

# Installed the way `make install` does it (a virtualenv, pip upgraded, the project installed by
# pip), but not editable and without the dev extras.
RUN python -m venv /opt/nvplugin \
 && /opt/nvplugin/bin/python -m pip install --upgrade pip \
 && /opt/nvplugin/bin/python -m pip install /src \
 && rm -rf /src \
 && chown -R nvplugin:nvplugin /opt/nvplugin \
 && chmod -R a-w /opt/nvplugin \
 && nvplugin --version

# root by default, as NVIDIA's image: NVIDIA's static DaemonSets set no user, and the kubelet's
# device-plugin directory (0755) and kubelet.sock are root's. Run as another user, the plugin exits
# 2 naming the user and the fix.
USER 0:0
ENTRYPOINT ["nvplugin"]
CMD ["serve"]
