"""`antdt sim`: what each policy would do to a job on a simulated cluster, before it is
trusted with a real one. Closed loop over the real detector, policies and plan builder;
needs the `sim` extra (numpy; matplotlib for the PNG)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

if TYPE_CHECKING:
    from antdt.sim.files import ScenarioFile
    from antdt.sim.simulate import Simulation

out = Console(width=None if Console().is_terminal else 140)  # a file has no width


def sim(
    scenario: Annotated[Path, typer.Argument(help="Scenario file (TOML; examples/sim/)")],
    policy: Annotated[
        list[str] | None, typer.Option("--policy", "-p", help="Policies to compare (repeat)")
    ] = None,
    ranks: Annotated[int | None, typer.Option(help="Override the file's ranks")] = None,
    steps: Annotated[int | None, typer.Option(help="Override the file's steps")] = None,
    seed: Annotated[int | None, typer.Option(help="Override the file's seed")] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="Directory for the JSON and PNG")] = Path(
        "runs/sim"
    ),
) -> None:
    """Run every policy of SCENARIO, `none` and an oracle on the same simulated cluster;
    print the figures, write NAME.json and NAME.png."""
    try:
        from antdt.sim.files import ScenarioError, load_scenario
        from antdt.sim.report import save_json, save_png, table
    except ImportError as exc:
        Console(stderr=True).print(f"[red]sim: {exc}; install antdt[sim][/]")
        raise typer.Exit(2) from None
    overrides = {
        k: v
        for k, v in (("ranks", ranks), ("steps", steps), ("seed", seed), ("policies", policy))
        if v
    }
    try:
        chosen = load_scenario(scenario, **overrides)
    except (ScenarioError, OSError) as exc:
        Console(stderr=True).print(f"[red]sim: {exc}[/]")
        raise typer.Exit(2) from None
    result = _with_progress(chosen)
    out.print(table(chosen, result.figures))
    out_dir.mkdir(parents=True, exist_ok=True)
    print(save_json(out_dir / f"{chosen.name}.json", chosen, result.figures))
    png = save_png(out_dir / f"{chosen.name}.png", chosen, result.runs, result.figures)
    print(png if png is not None else "no PNG: matplotlib is not installed (antdt[sim])")


def _with_progress(scenario: ScenarioFile) -> Simulation:
    """The simulation, with a progress bar per run on the console."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from antdt.sim.simulate import simulate

    names = ["oracle", "none", *(p for p in scenario.policies if p != "none")]
    columns = (
        TextColumn("{task.description:>10}"),
        BarColumn(),
        TextColumn("{task.completed:,}/{task.total:,} steps"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=out) as bar:
        tasks = {n: bar.add_task(n, total=scenario.steps) for n in names}
        every = max(1, scenario.steps // 200)

        def tick(what: str, done: int) -> None:
            if done % every == 0 or done == scenario.steps:
                bar.update(tasks[what], completed=done)

        return simulate(scenario, tick)
