from mara_rl.cli import main


def test_bench_prints_every_figure(smoke_bank, untrained_fm, tmp_path, capsys):
    fm = untrained_fm.export(tmp_path / "predictor")  # exported for torch inference
    main(["bench", "--profile", "smoke", "--bank", str(smoke_bank), "--steps", "300", "--skip-bank",
          "--fm", str(fm), "--history", str(smoke_bank)])  # any bank with every family serves as a history pool here
    out = capsys.readouterr().out
    for label in ("predictor=wls", "predictor=oracle", "predictor=fm ", "predictor=fm_numpy", "predictor=history",
                  "8 envs pooled", "MAT decision latency", "PPO training throughput"):
        assert label in out
    rates = [float(line.split(":")[1].split()[0]) for line in out.splitlines() if "steps/s" in line]
    assert len(rates) == 11 and all(r > 0 for r in rates)
