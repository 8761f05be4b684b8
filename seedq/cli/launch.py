"""`seedq launch k8s | tpu-vm | gpu-vm`: a run on Kubernetes or on cloud VMs."""

from __future__ import annotations

import argparse
import sys

from seedq import config as config_lib
from seedq.cli.common import HelpFormatter, default_config
from seedq.config import TrainConfig
from seedq.process.exit_codes import UsageError
from seedq.flags import add_config_flags, config_from_args


def add_parsers(sub) -> None:
    """`seedq launch k8s | tpu-vm | gpu-vm`: every training flag plus the launcher's own."""
    from seedq.launch.options import K8sOptions, VmOptions

    launch = sub.add_parser("launch", help="run on Kubernetes or on cloud TPU/GPU VMs (launch/README.md)")
    launch_sub = launch.add_subparsers(dest="launch", required=True)
    k8s = launch_sub.add_parser(
        "k8s", help="print Kubernetes manifests for a run (learner and actors as Indexed Jobs, ...)",
        description="Print Kubernetes manifests (multi-document YAML) for a run: the run config as a "
        "ConfigMap, the learner as an Indexed Job with a headless Service, the actors as "
        "Indexed Jobs that complete when the run ends, the run directory on a PersistentVolumeClaim; Secrets are referenced by name.",
        formatter_class=HelpFormatter,
    )
    add_config_flags(k8s, K8sOptions)
    vms = []
    for kind, what in (("tpu-vm", "a Cloud TPU VM (queued resource)"), ("gpu-vm", "a GPU VM")):
        vm = launch_sub.add_parser(
            kind, help=f"the gcloud commands that run the learner on {what} and actors on a managed "
            "instance group (--dry-run prints them)",
            description=f"Create {what}, install seedq (by default a wheel of this checkout), start the "
            "learner, create a managed instance group of CPU actor VMs, which the learner resizes to zero "
            "when the run ends; --down deletes it all. Without --dry-run the plan (resources, an hourly "
            "estimate) is printed and, after a yes (or --yes), the commands run, stopping at the first failure.",
            formatter_class=HelpFormatter,
        )
        add_config_flags(vm, VmOptions)
        vm.add_argument("--dry-run", action="store_true", help="print the commands (a shell script) instead")
        vm.add_argument("--down", action="store_true", help="the teardown commands instead")
        vm.add_argument("--yes", action="store_true",
                        help="run without asking (needed where no terminal can answer the question)")
        vms.append(vm)
    for parser in (k8s, *vms):
        add_config_flags(parser)
        parser.add_argument("--config", metavar="RUN.json", default=None,
                            help="start from this run config; flags given here override it")


def _launch_config(args: argparse.Namespace) -> TrainConfig:
    """The run config of a launch: env defaults, then --config, then the flags (no timestamped logdir)."""
    data = config_lib.read_json(args.config) if args.config else {}
    try:
        base = config_lib.updated(default_config(args.env or data.get("env")), data)
    except ValueError as e:
        raise ValueError(f"--config {args.config}: {e}") from None
    return config_from_args(args, base=base)


def run(args: argparse.Namespace) -> int:
    from seedq.launch.options import K8sOptions, VmOptions

    prog = f"seedq launch {args.launch}"
    try:
        config = _launch_config(args)
        if args.launch == "k8s":
            from seedq.launch import k8s

            given = [name for name in k8s.RENDER_OWNED if getattr(args, name, None) is not None]
            if given:
                raise ValueError(
                    f"--{given[0].replace('_', '-')} is set by the render (the learner serves "
                    "0.0.0.0:--port; credentials come from the Secrets named by --tls-mode, "
                    "--learner-tls-secret, --actor-tls-secret, --token-secret)"
                )
            sys.stdout.write(k8s.render(config, config_from_args(args, K8sOptions)))
            return 0
        from seedq.launch import gcloud

        opts = config_from_args(args, VmOptions)
        kind = "tpu" if args.launch == "tpu-vm" else "gpu"
        if not (args.dry_run or args.yes or sys.stdin.isatty()):
            # Billable resources (or their deletion) need a yes nobody could give here.
            raise UsageError(
                f"{'deletes' if args.down else 'creates billable'} cloud resources and asks first, but no "
                "terminal can answer: pass --yes to go ahead, or --dry-run to print the commands")
        if args.down:
            steps = gcloud.teardown_plan(config, opts, kind)
            summary = ["will delete:", *("  " + line for line in gcloud.teardown_summary(steps))]
        else:
            gcloud.check_inputs(config, opts, kind)  # before the wheel is built
            opts, config = _with_install(opts, config)
            steps = (gcloud.tpu_vm_plan if kind == "tpu" else gcloud.gpu_vm_plan)(config, opts)
            summary = [f"will create (installing {config.code_source}):",
                       *("  " + line for line in gcloud.plan_summary(config, opts, kind))]
    except (ValueError, OSError) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        shebang, script = gcloud.to_shell(steps).split("\n", 1)
        sys.stdout.write("\n".join([shebang, *("# " + line for line in summary)]) + "\n" + script)
        return 0
    print("\n".join(summary), flush=True)
    if not args.yes and not _answered_yes("Go ahead? [y/N] "):
        print(f"{prog}: nothing done", file=sys.stderr)
        return 1
    code = gcloud.run_plan(steps, log=lambda line: print(f"{prog}: {line}", file=sys.stderr, flush=True))
    return code


def _answered_yes(question: str) -> bool:
    try:
        return input(question).strip().lower() in ("y", "yes")
    except (EOFError, KeyboardInterrupt):  # Ctrl-D / Ctrl-C at the question: a no
        print()
        return False


def _with_install(opts, config: TrainConfig):
    """The options with a wheel of this checkout built when --install is empty,
    and the run config recording which code the VMs install (`code_source`)."""
    import dataclasses
    import os

    from seedq.launch import gcloud

    if not opts.install:
        wheel = gcloud.build_checkout_wheel(opts.wheel_dir)
        opts, source = dataclasses.replace(opts, install=wheel.path), wheel.describe()
    elif gcloud.install_is_local_wheel(opts):
        source = f"{os.path.basename(opts.install)} (sha256 {gcloud.sha256_of(opts.install)[:16]})"
    else:
        source = opts.install
    return opts, dataclasses.replace(config, code_source=source)
