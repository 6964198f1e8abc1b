"""`antdt sim`: what each policy would do to a job on a simulated cluster, before it is
trusted with a real one. Closed loop over the real detector, policies and plan builder;
needs the `sim` extra (numpy; matplotlib for the PNG)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from antdt.cli.options import NatsOpt

if TYPE_CHECKING:
    from antdt.sim.files import ScenarioFile
    from antdt.sim.simulate import Simulation

out = Console(width=None if Console().is_terminal else 140)  # a file has no width


def sim(
    scenario: Annotated[
        Path | None, typer.Argument(help="Scenario file (TOML; examples/sim/)")
    ] = None,
    policy: Annotated[
        list[str] | None, typer.Option("--policy", "-p", help="Policies to compare (repeat)")
    ] = None,
    ranks: Annotated[int | None, typer.Option(help="Override the file's ranks")] = None,
    steps: Annotated[int | None, typer.Option(help="Override the file's steps")] = None,
    seed: Annotated[int | None, typer.Option(help="Override the file's seed")] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="Directory for the JSON and PNG")] = Path(
        "runs/sim"
    ),
    from_job: Annotated[
        str | None, typer.Option("--from-job", help="Replay this job's recorded steps")
    ] = None,
    from_steps: Annotated[
        Path | None, typer.Option("--from-steps", help="Replay a steps file (JSON lines)")
    ] = None,
    save_steps: Annotated[
        Path | None, typer.Option("--save-steps", help="With --from-job: keep its steps here")
    ] = None,
    jobs: Annotated[
        int,
        typer.Option(
            "--jobs",
            "-j",
            min=0,
            help="Runs side by side in this many processes (0: one per core, up to the "
            "runs, for 1,000,000 rank-steps or more; 1: one after another)",
        ),
    ] = 0,
    nats_url: NatsOpt = None,
) -> None:
    """Run every policy of SCENARIO, `none` and an oracle on the same simulated cluster;
    print the figures, write NAME.json and NAME.png. With --from-job or --from-steps:
    replay a finished run's recorded steps under each --policy instead."""
    if from_job is not None or from_steps is not None:
        from antdt.cli.replay import replay_run

        replay_run(from_job, from_steps, save_steps, policy, out_dir, nats_url)
        return
    if scenario is None:
        Console(stderr=True).print("[red]sim: give a scenario file, --from-job or --from-steps[/]")
        raise typer.Exit(2)
    try:
        from antdt.sim.files import ScenarioError, load_scenario
        from antdt.sim.report import save_json, save_png, table
    except ImportError as exc:
        Console(stderr=True).print(f"[red]sim: {exc}; install antdt\\[sim][/]")
        raise typer.Exit(2) from None
    overrides = {
        k: v
        for k, v in (("ranks", ranks), ("steps", steps), ("seed", seed), ("policies", policy))
        if v is not None
    }
    try:
        chosen = load_scenario(scenario, **overrides)
    except (ScenarioError, OSError) as exc:
        Console(stderr=True).print(f"[red]sim: {exc}[/]")
        raise typer.Exit(2) from None
    result = _with_progress(chosen, jobs)
    out.print(table(chosen, result.figures))
    out_dir.mkdir(parents=True, exist_ok=True)
    print(save_json(out_dir / f"{chosen.name}.json", chosen, result.figures))
    png = save_png(out_dir / f"{chosen.name}.png", chosen, result.runs, result.figures)
    print(png if png is not None else "no PNG: matplotlib is not installed (antdt[sim])")


def _with_progress(scenario: ScenarioFile, jobs: int) -> Simulation:
    """The simulation in `jobs` processes (0: `default_workers`), with a progress bar
    per run on the console."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from antdt.sim.simulate import run_names, simulate
    from antdt.sim.workers import default_workers, tick_every

    names = run_names(scenario)
    workers = jobs or default_workers(scenario, len(names))
    columns = (
        TextColumn("{task.description:>10}"),
        BarColumn(),
        TextColumn("{task.completed:,}/{task.total:,} steps"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=out) as bar:
        tasks = {n: bar.add_task(n, total=scenario.steps) for n in names}
        every = tick_every(scenario.steps)

        def tick(what: str, done: int) -> None:
            if done % every == 0 or done == scenario.steps:
                bar.update(tasks[what], completed=done)

        return simulate(scenario, tick, workers=workers)
