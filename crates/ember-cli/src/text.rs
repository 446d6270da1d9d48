//! `ember train text` and `ember generate`: a character-level GPT
//! ([`CharGpt`]) trained on the New Testament shipped in `data/`, with AdamW,
//! linear warm-up and cosine decay, gradient clipping and a validation split;
//! the model is saved with its vocabulary, and text is sampled from it.

use crate::args::{SamplingArgs, TextArgs, TrainArgs, MODEL_FILE, STATE_FILE};
use clap::Args;
use ember::data::{CharCorpus, Split};
use ember::models::{CharGpt, GptConfig};
use ember::nn::{self, Module};
use ember::optim::{split_for_weight_decay, Adam, Groups, LrScheduler, Optimizer, SequentialLr};
use ember::prelude::*;
use std::path::{Path, PathBuf};
use std::time::Instant;

fn invalid(msg: impl Into<String>) -> Error {
    Error::InvalidArgument {
        op: "train text",
        msg: msg.into(),
    }
}

/// The model's shape and the training's settings, from the command line.
pub fn run(args: &TrainArgs, device: Device) -> ember::Result<()> {
    let t = &args.text;
    if args.epochs.is_some() {
        return Err(invalid("a language model trains for --steps, not --epochs"));
    }
    if args.model.is_some() || args.input.is_some() || args.classes.is_some() || args.plot.is_some()
    {
        return Err(invalid(
            "--model, --input, --classes and --plot are for the classifiers; the text model takes --layers, --heads, --width, --context",
        ));
    }
    if args.estimate || args.skip_memory_check || args.drop_last {
        return Err(invalid(
            "--estimate, --skip-memory-check and --drop-last are for the classifiers: the text \
             model draws its batches at random, and its memory is not estimated before training",
        ));
    }
    if args.resume && args.checkpoint.is_none() {
        return Err(invalid(
            "--resume continues the run saved in --checkpoint DIR: name the folder",
        ));
    }
    if t.checkpoint_every.is_some() && args.checkpoint.is_none() {
        return Err(invalid(
            "--checkpoint-every: name the folder to save in with --checkpoint DIR",
        ));
    }
    if t.checkpoint_every == Some(0) {
        return Err(invalid(
            "--checkpoint-every 0: save every N steps, N at least 1",
        ));
    }
    if args.optimizer != crate::estimate::OptimizerKind::Adam || args.cuda_graphs {
        return Err(invalid(
            "--optimizer and --cuda-graphs are for the classifiers: the text model trains with AdamW, its learning rate changing at every step (warm-up, cosine decay), which a replayed graph would not see",
        ));
    }
    let batch = args.batch_size.map_or(32, |b| b as usize);
    let amp = args.amp.map(|a| a.dtype());
    let mut scaler = ember::amp::GradScaler::new().enabled(amp == Some(DType::F16));
    let lr = args.lr.unwrap_or(3e-3);
    for (flag, v) in [
        ("--steps", t.steps),
        ("--eval-every", t.eval_every),
        ("--context", t.context),
        ("--layers", t.layers),
        ("--heads", t.heads),
        ("--width", t.width),
    ] {
        if v == 0 {
            return Err(invalid(format!("{flag} 0: must be positive")));
        }
    }
    if !t.width.is_multiple_of(t.heads) {
        return Err(invalid(format!(
            "--width {}: must be a multiple of --heads ({}), each head taking an equal share",
            t.width, t.heads
        )));
    }
    if !(0.0..1.0).contains(&t.dropout) {
        return Err(invalid(format!(
            "--dropout {}: must be in [0, 1)",
            t.dropout
        )));
    }
    if t.eval_batches == 0 {
        return Err(invalid(
            "--eval-batches 0: a validation loss averages at least one batch",
        ));
    }
    // the sampling after training is checked now, not after the run
    t.sampling.check("train text")?;
    let path = crate::args::data_file(args)?.expect("the text has a data file");
    ember::manual_seed(args.seed);
    let corpus = CharCorpus::from_file(&path, 0.1)?;
    if corpus.vocab_size() == 0 {
        return Err(invalid(format!(
            "{} is empty: there is no text to train on",
            path.display()
        )));
    }
    // the text must hold a window of --context characters (and the one after
    // it) in each split
    let shortest = corpus
        .ids(Split::Train)
        .len()
        .min(corpus.ids(Split::Val).len());
    if shortest <= t.context {
        return Err(invalid(format!(
            "--context {}: {} holds {} characters, {shortest} of them in its smaller split \
             (a tenth is for validation); a window needs {} (the context and the next \
             character): use a shorter --context or a longer text",
            t.context,
            path.display(),
            corpus.ids(Split::Train).len() + corpus.ids(Split::Val).len(),
            t.context + 1
        )));
    }
    if t.sample > 0 {
        corpus
            .encode(&t.sampling.prompt)
            .map_err(|e| invalid(format!("--prompt: {e}")))?;
    }
    // what makes two runs the same run: a resumed run must match the saved one
    let settings: Vec<(String, String)> = [
        ("data", crate::paths::data_identity(&path)?),
        ("context", t.context.to_string()),
        ("layers", t.layers.to_string()),
        ("heads", t.heads.to_string()),
        ("width", t.width.to_string()),
        ("dropout", t.dropout.to_string()),
        ("steps", t.steps.to_string()),
        ("batch_size", batch.to_string()),
        ("lr", lr.to_string()),
        ("seed", args.seed.to_string()),
        ("amp", amp.map_or("none".to_string(), |d| d.to_string())),
    ]
    .into_iter()
    .map(|(k, v)| (format!("run.{k}"), v))
    .collect();
    let state_file = args.checkpoint.as_ref().map(|d| d.join(STATE_FILE));
    // the saved run's metadata (its settings and last losses), read once
    let saved_meta = match (args.resume, &state_file) {
        (true, Some(file)) => check_settings(file, &settings)?,
        _ => Vec::new(),
    };
    let config = GptConfig {
        vocab_size: corpus.vocab_size(),
        context: t.context,
        layers: t.layers,
        heads: t.heads,
        width: t.width,
        dropout: t.dropout,
    };
    let mut model = CharGpt::new(config, &device)?;
    model.blocks.checkpoint_layers(args.checkpoint_activations);
    let params = model.parameters();
    // no weight decay on biases and the norms' scales, as GPT training does
    let (decay, no_decay) = split_for_weight_decay(params.clone());
    let mut opt = Groups::new(vec![
        Box::new(Adam::adamw(decay, lr)?),
        Box::new(Adam::adamw(no_decay, lr)?.weight_decay(0.0)?),
    ])?;
    // a tenth of the steps to warm up linearly, then cosine decay to lr / 10
    let warmup = (t.steps / 10).max(1).min(t.steps);
    let mut sched = SequentialLr::warmup_cosine(&mut opt, warmup, t.steps, lr / 10.0)?;
    let mut done = 0usize;
    let mut train_loss = f64::NAN;
    let mut val = f64::NAN;
    if let (true, Some(file)) = (args.resume, &state_file) {
        let extra = ember::io::load_checkpoint(&model, &mut opt, file)?;
        let get = |k: &str| -> ember::Result<f64> {
            let t = extra
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, t)| t)
                .ok_or_else(|| invalid(format!("{}: no {k:?} entry", file.display())))?;
            t.to_dtype(DType::F64)?.item::<f64>()
        };
        done = get("step")? as usize;
        let last = |k: &str| {
            saved_meta
                .iter()
                .find(|(n, _)| n == k)
                .and_then(|(_, v)| v.parse::<f64>().ok())
                .unwrap_or(f64::NAN)
        };
        train_loss = last("last.train_loss");
        val = last("last.val_loss");
        let scale: Vec<(String, f64)> = extra
            .iter()
            .filter_map(|(n, t)| {
                let k = n.strip_prefix("scaler.")?;
                Some(
                    t.to_dtype(DType::F64)
                        .and_then(|t| t.item::<f64>())
                        .map(|v| (k.to_string(), v)),
                )
            })
            .collect::<ember::Result<_>>()?;
        scaler.load_state_dict(&scale)?;
        sched.set_epoch(done);
        if done >= t.steps {
            println!(
                "nothing to do: the checkpoint in {} is at step {done} of {}",
                args.checkpoint
                    .as_ref()
                    .expect("resume has a folder")
                    .display(),
                t.steps
            );
            // the sample asked for, from the finished run's model
            return print_sample(&mut model, &corpus, t);
        }
    }
    let baseline = corpus.unigram_loss();
    let (n_train, n_val) = (corpus.ids(Split::Train).len(), corpus.ids(Split::Val).len());
    if !args.quiet {
        println!(
            "training a character GPT ({}, {}, width {}, context {}; {} parameters) on {} ({n_train} train / {n_val} validation characters, {} symbols), batch {batch}, AdamW lr {lr} (weight decay 0.01 on matrices, none on biases and norms; warm-up {}, cosine decay), on {device}{}",
            crate::paths::count(t.layers, "layer"), crate::paths::count(t.heads, "head"), t.width, t.context, model.num_parameters(), path.display(), corpus.vocab_size(), crate::paths::count(warmup, "step"),
            match amp {
                Some(DType::F16) => ", autocast float16 with loss scaling".to_string(),
                Some(dt) => format!(", autocast {dt}"),
                None => String::new(),
            }
        );
        println!("unigram baseline: {baseline:.3} nats per character on the validation text");
    }
    // every step draws (its batch, dropout's masks) from a generator of its own,
    // seeded from the run's seed and the step, and so does each validation: a
    // resumed run draws what an uninterrupted one would, with no generator
    // state to save
    let rng = |step: usize, stream: u64| ember::Generator::new(step_seed(args.seed, step, stream));
    let eval = |model: &mut CharGpt, step: usize| -> ember::Result<f64> {
        model.eval();
        let total = rng(step, 1).scope(|| -> ember::Result<f64> {
            let mut total = 0.0;
            for _ in 0..t.eval_batches {
                let (x, y) = corpus.batch(Split::Val, batch, t.context, &device)?;
                let _ac = amp.map(ember::autocast_guard).transpose()?;
                total += ember::no_grad(|| model.loss(&x, &y))?.item::<f32>()? as f64;
            }
            Ok(total)
        })?;
        model.train();
        Ok(total / t.eval_batches as f64)
    };
    let every = t.checkpoint_every.unwrap_or(t.eval_every);
    let start = Instant::now();
    let mut profiler = args
        .profile
        .is_some()
        .then(|| {
            ember::profiler::StepProfiler::new(crate::profile::WARMUP, args.profile_steps as usize)
        })
        .transpose()?;
    if let (true, Some(dir)) = (args.resume, &args.checkpoint) {
        println!("resumed from {} after step {done}", dir.display());
    }
    for step in done + 1..=t.steps {
        // a range only while a session records
        let _step = ember::profiler::range("train_step");
        let loss = rng(step, 0).scope(|| -> ember::Result<Tensor> {
            let (x, y) = corpus.batch(Split::Train, batch, t.context, &device)?;
            let loss = {
                let _ac = amp.map(ember::autocast_guard).transpose()?;
                model.loss(&x, &y)?
            };
            opt.zero_grad();
            // with float16 the loss is scaled, and the gradients unscaled before
            // clipping; otherwise the scaler passes everything through
            scaler.scale(&loss)?.backward()?;
            Ok(loss)
        })?;
        scaler.unscale_(&opt)?;
        nn::clip_grad_norm_(&params, 1.0, 2.0, false)?;
        scaler.step(&mut opt)?;
        scaler.update()?;
        sched.step(&mut opt);
        drop(_step);
        if let Some(p) = profiler.as_mut() {
            p.step()?;
        }
        if step % t.eval_every == 0 || step == t.steps {
            train_loss = loss.item::<f32>()? as f64;
            val = eval(&mut model, step)?;
            if !args.quiet {
                let secs = start.elapsed().as_secs_f64();
                println!(
                    "step {step:>5}/{}  train loss {train_loss:.3}  validation loss {val:.3}  {:.2} steps/s  {secs:.0} s",
                    t.steps,
                    (step - done) as f64 / secs
                );
            }
        }
        if let Some(dir) = &args.checkpoint {
            if step % every == 0 || step == t.steps {
                // a diverged run stops, its last good checkpoint kept (one of NaN
                // parameters would neither load in `generate` nor resume)
                if let Some(name) = ember::io::first_non_finite_state(&model, &opt)? {
                    return Err(invalid(format!(
                        "step {step}: {name} holds NaN or infinite values (the training \
                         diverged: a smaller --lr may help); nothing was saved, and a \
                         checkpoint of an earlier step in {} is kept",
                        dir.display()
                    )));
                }
                let cpu = Device::Cpu;
                let mut extra = vec![("step".to_string(), Tensor::scalar(step as i64, &cpu)?)];
                for (k, v) in scaler.state_dict() {
                    extra.push((format!("scaler.{k}"), Tensor::scalar(v, &cpu)?));
                }
                // the model for `ember generate`, then the state to resume from
                // (each written whole or not at all)
                save(&model, &corpus, dir)?;
                // the last losses (NaN before the first validation) as text: a
                // checkpoint's tensors must be finite
                let mut meta: Vec<(String, String)> = settings.clone();
                meta.push(("last.train_loss".into(), train_loss.to_string()));
                meta.push(("last.val_loss".into(), val.to_string()));
                ember::io::save_checkpoint_full(&model, &opt, &extra, &meta, dir.join(STATE_FILE))?;
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let profile = match profiler.as_mut() {
        Some(p) => {
            p.stop()?;
            p.take()
        }
        None => None,
    };
    println!("device: {device}");
    println!(
        "time: {secs:.1} s ({:.1} ms per step)",
        secs * 1e3 / (t.steps - done) as f64
    );
    println!("final train loss: {train_loss:.4}");
    println!("validation loss: {val:.4} (unigram baseline {baseline:.4})");
    crate::profile::report_run(profile.as_ref(), "the character GPT", &args.profile)?;
    if let Some(dir) = &args.checkpoint {
        println!("model: {}", dir.join(MODEL_FILE).display());
    }
    print_sample(&mut model, &corpus, t)
}

/// With `--sample N`, N characters after `--prompt` from the trained model (in
/// evaluation mode).
fn print_sample(model: &mut CharGpt, corpus: &CharCorpus, t: &TextArgs) -> ember::Result<()> {
    if t.sample == 0 {
        return Ok(());
    }
    model.eval();
    let prompt = corpus
        .encode(&t.sampling.prompt)
        .map_err(|e| invalid(format!("--prompt: {e}")))?;
    let sm = &t.sampling;
    let text = corpus.decode(&model.generate(&prompt, t.sample, sm.temperature, sm.top_k)?)?;
    println!(
        "sample (temperature {}, top-k {}):\n{}{text}",
        sm.temperature,
        sm.top_k.map_or("all".into(), |k| k.to_string()),
        sm.prompt
    );
    Ok(())
}

/// The seed of step `step`'s draws (`stream` 0: training, 1: validation):
/// SplitMix64 over the run's seed, the step and the stream.
fn step_seed(seed: u64, step: usize, stream: u64) -> u64 {
    let mut z = seed
        ^ (step as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ stream.wrapping_mul(0xd1b5_4a32_d192_ed03);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Refuses to resume from `file` a run whose settings differ from `here`,
/// naming each difference; otherwise returns the file's metadata.
fn check_settings(file: &Path, here: &[(String, String)]) -> ember::Result<Vec<(String, String)>> {
    if !file.exists() {
        return Err(invalid(format!(
            "--resume: {} does not exist (was the run saved with --checkpoint before it \
             stopped?)",
            file.display()
        )));
    }
    let saved = ember::io::metadata(file)?;
    let mut diffs = Vec::new();
    for (k, w) in here {
        let name = k.trim_start_matches("run.");
        match saved.iter().find(|(n, _)| n == k) {
            Some((_, v)) if v == w => {}
            Some((_, v)) => diffs.push(format!("{name} is {v} there and {w} here")),
            None => diffs.push(format!("{name} is not set there and is {w} here")),
        }
    }
    if diffs.is_empty() {
        return Ok(saved);
    }
    Err(invalid(format!(
        "--resume: {} was saved by a run with other settings: {}. Resume with the same \
         settings, or start a new run in another folder",
        file.display(),
        diffs.join("; ")
    )))
}

/// The model's weights, its vocabulary and shape in one safetensors file.
fn save(model: &CharGpt, corpus: &CharCorpus, dir: &Path) -> ember::Result<()> {
    let c = model.config;
    let vocab: String = corpus.vocab().iter().collect();
    let meta = vec![
        ("vocab".to_string(), vocab),
        ("context".to_string(), c.context.to_string()),
        ("layers".to_string(), c.layers.to_string()),
        ("heads".to_string(), c.heads.to_string()),
        ("width".to_string(), c.width.to_string()),
    ];
    let state: Vec<(String, Tensor)> = model
        .state_dict()
        .into_iter()
        .map(|(n, t)| Ok((n, t.to(&Device::Cpu)?)))
        .collect::<ember::Result<_>>()?;
    ember::io::save_with_metadata(&state, &meta, dir.join(MODEL_FILE))
}

/// `ember generate`: text from a model saved by `ember train text --checkpoint DIR`.
#[derive(Args, Clone, Debug)]
pub struct GenerateArgs {
    /// The folder `ember train text --checkpoint` saved the model in.
    #[arg(long, value_name = "DIR")]
    pub checkpoint: PathBuf,
    /// Characters to generate.
    #[arg(long, default_value_t = 500)]
    pub chars: usize,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Seed of the draws.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// `auto`, `cpu` or `cuda:N`.
    #[arg(long, default_value = "auto")]
    pub device: String,
}

/// Loads the model and prints `--prompt` and what follows it.
pub fn generate(args: &GenerateArgs) -> ember::Result<()> {
    args.sampling.check("generate")?;
    let device = crate::paths::device(&args.device, "--device")?;
    if device.is_meta() {
        return Err(Error::InvalidArgument {
            op: "generate",
            msg: "--device meta: a meta tensor has no values to sample from; generate on cpu \
                  or cuda:N"
                .into(),
        });
    }
    let path = args.checkpoint.join(MODEL_FILE);
    if !path.is_file() {
        let what = if args.checkpoint.is_dir() {
            format!("there is no {MODEL_FILE} in it")
        } else {
            format!("there is no such folder (it would hold {MODEL_FILE})")
        };
        return Err(Error::InvalidArgument {
            op: "generate",
            msg: format!(
                "--checkpoint {}: {what} (save one with `ember train text --checkpoint DIR`)",
                args.checkpoint.display()
            ),
        });
    }
    let meta = ember::io::metadata(&path)?;
    let get = |k: &str| -> ember::Result<String> {
        meta.iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
            .ok_or_else(|| Error::InvalidArgument {
                op: "generate",
                msg: format!(
                    "{}: no {k:?} entry; is this a model saved by `ember train text`?",
                    path.display()
                ),
            })
    };
    let num = |k: &str| -> ember::Result<usize> {
        get(k)?.parse().map_err(|_| Error::InvalidArgument {
            op: "generate",
            msg: format!("{}: the {k:?} entry is not a number", path.display()),
        })
    };
    let vocab: String = get("vocab")?;
    let corpus = CharCorpus::new(&vocab, 0.0)?;
    let config = GptConfig {
        vocab_size: corpus.vocab_size(),
        context: num("context")?,
        layers: num("layers")?,
        heads: num("heads")?,
        width: num("width")?,
        dropout: 0.0,
    };
    let mut model = CharGpt::new(config, &Device::Cpu)?;
    ember::io::load_state_dict(&model, &path)?;
    model.to_device(&device)?;
    model.eval();
    ember::manual_seed(args.seed);
    let prompt = corpus
        .encode(&args.sampling.prompt)
        .map_err(|e| Error::InvalidArgument {
            op: "generate",
            msg: format!("--prompt: {e}"),
        })?;
    let sm = &args.sampling;
    // each character printed as it is drawn (the same draws as one call for all:
    // every step reads the last window anyway), so an interrupted generation
    // keeps what it made
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let io_err = |e: std::io::Error| Error::Io {
        path: "standard output".into(),
        source: e,
    };
    write!(out, "{}", sm.prompt)
        .and_then(|()| out.flush())
        .map_err(io_err)?;
    let mut ids = prompt;
    for _ in 0..args.chars {
        let next = model.generate(&ids, 1, sm.temperature, sm.top_k)?;
        write!(out, "{}", corpus.decode(&next)?)
            .and_then(|()| out.flush())
            .map_err(io_err)?;
        ids.extend(next);
    }
    writeln!(out).map_err(io_err)?;
    Ok(())
}
