"""``nvplugin migrate``: NVIDIA's deployment to nvplugin's."""

from __future__ import annotations

import sys

import click

from nvplugin.cli.group import main, user_errors


@main.command()
@click.option(
    "--values",
    "values_file",
    metavar="FILE",
    help="A values file of NVIDIA's chart (helm show values, or helm get values RELEASE); - reads "
    "standard input.",
)
@click.option(
    "--daemonset",
    "daemonset_file",
    metavar="FILE",
    help="A manifest with a DaemonSet written for NVIDIA's image (static, or rendered by "
    "NVIDIA's chart: its GFD and MPS DaemonSets too); - reads standard input.",
)
@click.option(
    "--image-repository",
    metavar="REPO",
    default="nvplugin",
    show_default=True,
    help="Where nvplugin's image is (built from its Dockerfile): what NVIDIA's image becomes.",
)
@click.option("--output", type=click.Choice(["yaml", "json"]), default="yaml", show_default=True)
@user_errors
def migrate(
    values_file: str | None, daemonset_file: str | None, image_repository: str, output: str
) -> None:
    """Print nvplugin's equivalent of NVIDIA's deployment, and every change, by key path.

    A values file becomes the values for nvplugin's chart; a DaemonSet, the same DaemonSet with
    nvplugin's image. Above the YAML, as comments: what changed, what was dropped (NVIDIA's
    defaults of what nvplugin does not do), what differs, what nvplugin refuses (left out; the
    input as it is would fail), what nvplugin does not know. Exits 2 when something is refused,
    else 0.
    """
    from nvplugin import yamlinput
    from nvplugin.errors import InputError
    from nvplugin.migrate import findings
    from nvplugin.migrate.daemonset import migrate_daemonset
    from nvplugin.migrate.values import migrate_values

    if values_file is None and daemonset_file is None:
        raise InputError("migrate: give --values FILE, --daemonset FILE, or both")
    if values_file == daemonset_file == "-":
        raise InputError("migrate: only one of --values and --daemonset can read standard input")

    def read(path: str, what: str) -> tuple[str, str]:
        """The text of ``path`` (- : standard input, bounded as a file is) and its name."""
        if path == "-":
            data = sys.stdin.buffer.read(yamlinput.MAX_BYTES + 1)
            return yamlinput.decode(data, f"{what} on standard input"), "standard input"
        return yamlinput.read_text(path, f"{what} {path}"), path

    migrations = []
    if values_file is not None:
        text, name = read(values_file, "values file")
        migrations.append(migrate_values(text, name, image_repository))
    if daemonset_file is not None:
        text, name = read(daemonset_file, "manifest")
        migrations.append(migrate_daemonset(text, name, image_repository))
    if output == "json":
        click.echo(findings.to_json(migrations), nl=False)
    else:
        click.echo(findings.to_text(migrations), nl=False)
    refused = sum(len(m.refused) for m in migrations)
    if refused:
        click.echo(
            f'error: {refused} key(s) nvplugin cannot use ("refused" above): fix them before '
            "installing",
            err=True,
        )
        sys.exit(2)
