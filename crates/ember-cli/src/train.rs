//! `ember train`: a classifier on a data set shipped in `data/` (Iris or the UCI
//! digits), or a model of the zoo on random images (`fake`), trained by a
//! [`Trial`] on the chosen device. On a GPU the training step's memory is estimated
//! first (on the meta device): a run that would not fit is refused before it
//! starts, and the measured peak is printed next to the estimate after it.

use crate::args::{data_file, Dataset, TextArgs, TrainArgs, MODEL_FILE, STATE_FILE};
use crate::estimate::parse_shape;
use ember::cuda;
use ember::data::{self, DataLoader, TensorDataset};
use ember::distributed::{
    Backend, DistributedDataParallel, DistributedSampler, Options, ProcessGroup,
};
use ember::memory::{fmt_bytes, Estimate, Estimator};
use ember::models::{self, digits_cnn, mlp};
use ember::nn::{self, Module};
use ember::optim::{Adam, Optimizer, Sgd};
use ember::prelude::*;
use ember::train::{Checkpoint, Progress, Trial};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Refuses options given for a data set they do not apply to (a value other
/// than the option's default: an option left at its default cannot be told
/// apart from one not given).
fn check_applicable(args: &TrainArgs) -> ember::Result<()> {
    let (t, d) = (&args.text, TextArgs::default());
    let text_only = [
        ("--steps", t.steps != d.steps),
        ("--context", t.context != d.context),
        ("--layers", t.layers != d.layers),
        ("--heads", t.heads != d.heads),
        ("--width", t.width != d.width),
        ("--dropout", t.dropout != d.dropout),
        ("--eval-every", t.eval_every != d.eval_every),
        ("--eval-batches", t.eval_batches != d.eval_batches),
        ("--checkpoint-every", t.checkpoint_every.is_some()),
        ("--sample", t.sample != d.sample),
        (
            "--temperature",
            t.sampling.temperature != d.sampling.temperature,
        ),
        ("--top-k", t.sampling.top_k.is_some()),
        ("--prompt", t.sampling.prompt != d.sampling.prompt),
    ];
    let given: Vec<&str> = text_only
        .iter()
        .filter(|(_, g)| *g)
        .map(|(n, _)| *n)
        .collect();
    let dataset = format!("{:?}", args.dataset).to_lowercase();
    if args.dataset != Dataset::Text && !given.is_empty() {
        return Err(invalid(format!(
            "{} {} for `ember train text`; {dataset} does not take {}",
            given.join(", "),
            if given.len() == 1 { "is" } else { "are" },
            if given.len() == 1 { "it" } else { "them" }
        )));
    }
    if args.dataset == Dataset::Fake && args.data.is_some() {
        return Err(invalid(
            "--data names the folder of a data set to read; fake data is made, not read",
        ));
    }
    if args.dataset != Dataset::Fake && args.samples != TrainArgs::default().samples {
        return Err(invalid(format!(
            "--samples sets the size of fake data; {dataset} has its own"
        )));
    }
    Ok(())
}

pub fn run(args: &TrainArgs) -> ember::Result<()> {
    check_applicable(args)?;
    // a plot that cannot be written fails now, not after the training
    if let Some(plot) = &args.plot {
        let ext = plot.extension().and_then(|e| e.to_str()).unwrap_or("");
        if !ext.eq_ignore_ascii_case("svg") && !ext.eq_ignore_ascii_case("png") {
            return Err(ember::Error::InvalidArgument {
                op: "train",
                msg: format!(
                    "--plot {}: the file name must end in .svg or .png",
                    plot.display()
                ),
            });
        }
    }
    // every file the run writes: never its input, never another run's unless
    // --force (or --resume, for the checkpoint it continues)
    let inputs: Vec<PathBuf> = data_file(args)?.into_iter().collect();
    if let Some(plot) = &args.plot {
        crate::paths::new_output(plot, "--plot", &inputs, args.force)?;
        let csv = plot.with_extension("csv");
        crate::paths::new_output(&csv, "--plot (its curves, .csv)", &inputs, args.force)?;
    }
    crate::profile::check(&args.profile, &inputs, args.force)?;
    let csv = args.plot.as_ref().map(|p| p.with_extension("csv"));
    let outputs: Vec<(&str, &Path)> = [
        ("--plot", args.plot.as_deref()),
        ("--plot (its curves, .csv)", csv.as_deref()),
        (
            "--profile",
            args.profile.as_ref().and_then(|p| p.as_deref()),
        ),
    ]
    .into_iter()
    .filter_map(|(flag, p)| p.map(|p| (flag, p)))
    .collect();
    if let Some(dir) = &args.checkpoint {
        let own = [
            Checkpoint::file(dir),
            Checkpoint::history_file(dir),
            dir.join(MODEL_FILE),
            dir.join(STATE_FILE),
        ];
        crate::paths::spare_checkpoint_files(&outputs, &own)?;
    }
    if let Some(dir) = &args.checkpoint {
        if args.resume {
            if !dir.is_dir() {
                return Err(invalid(format!(
                    "--resume: there is no checkpoint folder {} to resume from",
                    dir.display()
                )));
            }
        } else {
            crate::paths::writable_dir(dir, "--checkpoint")?;
            let existing = [Checkpoint::file(dir), dir.join(MODEL_FILE)];
            if let Some(f) = existing.iter().find(|f| f.exists()) {
                if !args.force {
                    return Err(invalid(format!(
                        "--checkpoint {}: it holds another run's checkpoint ({}); pass --resume \
                         to continue that run, --force to replace it, or name another folder",
                        dir.display(),
                        f.display()
                    )));
                }
            }
        }
    }
    if let Some(lr) = args.lr {
        if !(lr.is_finite() && lr >= 0.0) {
            return Err(invalid(format!(
                "--lr {lr}: the learning rate must be a finite number, 0 or more"
            )));
        }
    }
    // under `ember launch`: one rank of a data-parallel run
    let launched = std::env::var_os("WORLD_SIZE").is_some();
    let dist_opts = launched
        .then(|| Options::from_env(Backend::Gloo))
        .transpose()?;
    let device = match &dist_opts {
        Some(o) if args.device == "auto" => rank_device(o)?,
        _ => crate::paths::device(&args.device, "--device")?,
    };
    // a GPU that is not there is an error now, before anything is loaded or printed
    if let Device::Cuda(i) = device {
        cuda::device_properties(i)?;
    }
    if launched && args.dataset == Dataset::Text {
        return Err(invalid(
            "`ember train text` does not run data-parallel (under `ember launch`) yet; train it in one process",
        ));
    }
    if args.dataset == Dataset::Text && !device.is_meta() {
        return crate::text::run(args, device);
    }
    if device.is_meta() {
        return Err(ember::Error::UnsupportedDevice {
            op: "train",
            device,
            msg: "training reads losses and accuracies, and a meta tensor has no values; \
                  train on cpu or cuda:N"
                .into(),
        });
    }
    let data = load(args)?;
    let (n_train, n_test) = (data.y_train.numel(), data.y_test.numel());
    let epochs = args.epochs.map_or(data.epochs, |e| e as usize);
    let batch = args.batch_size.map_or(data.batch, |b| b as usize);
    let sgd = args.optimizer == crate::estimate::OptimizerKind::Sgd;
    let lr = args.lr.unwrap_or(if sgd { 0.05 } else { data.lr });
    let eval_batch = 256;
    // under `ember launch`, each rank's share of every epoch's order; its samples
    // an epoch (padded up to an equal share, or cut down with --drop-last)
    let sampler = dist_opts
        .as_ref()
        .map(|o| {
            Ok::<_, Error>(
                DistributedSampler::new(n_train, o.world_size, o.rank)?
                    .seed(args.seed)
                    .drop_last(args.drop_last),
            )
        })
        .transpose()?;
    let per_rank = sampler.as_ref().map_or(n_train, |s| s.len());
    if args.drop_last && batch > per_rank {
        return Err(invalid(format!(
            "--drop-last with --batch-size {batch}: the {} data has {per_rank} training \
             samples{}, fewer than one batch, so every batch would be dropped and nothing \
             trained; use a smaller --batch-size or leave --drop-last out",
            format!("{:?}", args.dataset).to_lowercase(),
            if sampler.is_some() { " a rank" } else { "" }
        )));
    }
    // the estimate (on meta: it also checks, before anything is drawn or loaded on
    // a device, that the model takes the input, and the epoch's last batch where
    // it is smaller), and on a GPU the check that the training fits
    let checked = memory_check(
        args,
        &data,
        &device,
        (batch, per_rank % batch),
        eval_batch,
        lr,
        sgd,
    )?;
    // every rank has checked its arguments and its memory: now they meet
    // NCCL between GPUs, as PyTorch's scripts choose; the CPU backend otherwise
    let pg = dist_opts
        .map(|mut o| {
            o.backend = if device.is_cuda() {
                Backend::Nccl
            } else {
                Backend::Gloo
            };
            ProcessGroup::new(&o).map(Arc::new)
        })
        .transpose()?;
    let main = pg.as_ref().is_none_or(|pg| pg.rank() == 0);
    let world = pg.as_ref().map_or(1, |pg| pg.world_size());

    ember::manual_seed(args.seed);
    let model = (data.build)(&Device::Cpu)?;
    let params = model.num_parameters();
    let train = DataLoader::new(TensorDataset::new(data.x_train, data.y_train)?, batch)?
        .drop_last(args.drop_last);
    let train = match sampler {
        // each rank its share of every epoch's order, in batches of --batch-size
        Some(s) => train.sampler(s)?,
        None => train.shuffle(args.seed),
    };
    let test = DataLoader::new(TensorDataset::new(data.x_test, data.y_test)?, eval_batch)?;
    if device.is_cuda() {
        cuda::reset_peak_memory_stats(&device)?;
    }
    let mut config = vec![
        ("dataset", format!("{:?}", args.dataset).to_lowercase()),
        ("model", data.name.clone()),
        ("seed", args.seed.to_string()),
        ("lr", lr.to_string()),
    ];
    // the data's identity: resuming on another file (even of the same size)
    // is refused, naming it
    if let Some(path) = data_file(args)? {
        config.push(("data", crate::paths::data_identity(&path)?));
    }
    if world > 1 {
        // another world size visits other batches: resuming with it is refused
        config.push(("world_size", world.to_string()));
    }
    if args.dataset == Dataset::Fake {
        let input: Vec<String> = data.input.iter().map(|d| d.to_string()).collect();
        config.push(("input", input.join("x")));
        config.push(("classes", data.classes.to_string()));
        config.push(("samples", args.samples.to_string()));
    }
    let steps_per_epoch = train.len();
    let mut trial = match &pg {
        Some(pg) => {
            // on its device first, so that the gradient hooks are on the tensors
            // that train
            let mut model = model;
            model.to_device(&device)?;
            let ddp = DistributedDataParallel::new(model, pg.clone())?;
            new_trial(ddp, sgd, lr)?.distributed(pg.clone())
        }
        None => new_trial(model, sgd, lr)?,
    };
    trial = trial
        .config(config)
        .cuda_graphs(args.cuda_graphs)
        .amp(args.amp.map(|a| a.dtype()))?
        .metrics(&["loss", "accuracy"])?
        .progress(if args.quiet {
            Progress::Quiet
        } else {
            Progress::Auto
        })
        .to(&device)?
        .with_generators(Some(train), Some(test), None);
    if args.profile.is_some() {
        trial = trial.profile_steps(crate::profile::WARMUP, args.profile_steps as usize)?;
    }
    let mut resumed = None;
    if let Some(dir) = &args.checkpoint {
        trial = trial.callback(Checkpoint::new(dir));
        if args.resume {
            trial = trial.resume(dir)?;
            let done = trial.history().len();
            if done >= epochs {
                println!(
                    "nothing to do: the checkpoint in {} is at epoch {done}, and --epochs {epochs} asks for no more (ask for more than {done} epochs to continue it)",
                    dir.display()
                );
                return Ok(());
            }
            resumed = Some((dir, done));
        }
    }
    let ranks = match world {
        1 => String::new(),
        w => format!(
            " on each of {w} ranks (ember launch, {})",
            match pg.as_ref().map(|pg| pg.backend()) {
                Some(Backend::Nccl) => "NCCL",
                _ => "CPU backend",
            }
        ),
    };
    if main {
        println!(
        "training {} ({params} parameters) on {} ({n_train} train / {n_test} test samples), batch {batch}{ranks}, {} lr {lr}, on {device}{}{}",
        data.model,
        data.source,
        if sgd { "SGD (momentum 0.9)" } else { "Adam" },
        match args.amp.map(|a| a.dtype()) {
            Some(ember::DType::F16) => ", autocast float16 with loss scaling".to_string(),
            Some(dt) => format!(", autocast {dt}"),
            None => String::new(),
        },
        match (args.cuda_graphs, device.is_cuda()) {
            (true, true) => ", the step captured in a CUDA graph",
            // Trial::cuda_graphs changes nothing off a GPU: say so, not nothing
            (true, false) => ", no CUDA graph (--cuda-graphs captures GPU work: not used on this device)",
            _ => "",
        },
    );
        if let Some((dir, done)) = resumed {
            println!("resumed from {} after epoch {done}", dir.display());
        }
    }
    let syncs_before = device
        .is_cuda()
        .then(|| cuda::host_syncs(&device))
        .transpose()?;
    let history = trial.run(epochs)?.clone();
    let profile = trial.take_profile();
    let syncs = match syncs_before {
        Some(b) => Some(cuda::host_syncs(&device)? - b),
        None => None,
    };
    let Some(last) = history.last() else {
        return Err(Error::InvalidArgument {
            op: "train",
            msg: "no epoch ran".into(),
        });
    };
    let secs: f64 = history.records.iter().map(|r| r.seconds).sum();
    let test = trial.evaluate()?;
    if !main {
        return Ok(());
    }
    let get = |name: &str| {
        test.iter()
            .find(|(n, _)| n == name)
            .map_or(f64::NAN, |(_, v)| *v)
    };
    println!("device: {device}");
    // a resumed run's history holds the epochs of the run it resumed, each with
    // the time it took there
    let before = match resumed {
        Some((_, done)) => format!(", the first {done} before resuming"),
        None => String::new(),
    };
    println!(
        "time per epoch: {:.2} ms ({} epoch{} in {:.1} ms{before})",
        secs * 1e3 / history.len() as f64,
        history.len(),
        if history.len() == 1 { "" } else { "s" },
        secs * 1e3
    );
    println!("final loss: {:.4}", last.get("loss").unwrap_or(f64::NAN));
    println!(
        "train accuracy: {:.1}%",
        100.0 * last.get("acc").unwrap_or(f64::NAN)
    );
    println!("test loss: {:.4}", get("loss"));
    println!("test accuracy: {:.1}%", 100.0 * get("acc"));
    crate::profile::report_run(profile.as_ref(), &data.model, &args.profile)?;
    if let Some(plot) = &args.plot {
        history.write_plot(plot)?;
        let csv = plot.with_extension("csv");
        history.write_csv(&csv)?;
        println!("curves: {} and {}", plot.display(), csv.display());
    }
    if let Some(syncs) = syncs {
        // the epochs this run trained, each a pass over the training set
        let steps = (epochs - resumed.as_ref().map_or(0, |r| r.1)) * steps_per_epoch;
        println!(
            "host waits for the GPU while training: {syncs} in {steps} steps ({:.2} per step)",
            syncs as f64 / steps.max(1) as f64
        );
        if args.cuda_graphs {
            println!(
                "steps replayed from a CUDA graph: {} of {steps}",
                trial.graph_replays()
            );
        }
    }
    if device.is_cuda() {
        let measured = cuda::max_memory_allocated(&device)?;
        print!("peak memory allocated: {} measured", fmt_bytes(measured));
        let (train, eval) = &checked;
        println!(
            ", {} estimated (training step {}, evaluation {})",
            fmt_bytes(train.peak_allocated.max(eval.peak_allocated)),
            fmt_bytes(train.peak_allocated),
            fmt_bytes(eval.peak_allocated)
        );
    }
    Ok(())
}

/// A trial of `model` with SGD (momentum 0.9) or Adam, and the cross-entropy loss.
fn new_trial(model: impl Module + 'static, sgd: bool, lr: f64) -> ember::Result<Trial> {
    Ok(if sgd {
        let opt = Sgd::new(model.parameters(), lr)?.momentum(0.9)?;
        Trial::new(model, opt, nn::cross_entropy)
    } else {
        let opt = Adam::new(model.parameters(), lr)?;
        Trial::new(model, opt, nn::cross_entropy)
    })
}

/// `--device auto` for a rank under `ember launch`: the GPU of its local rank, or
/// the CPU on a machine without GPUs.
fn rank_device(o: &Options) -> ember::Result<Device> {
    let gpus = cuda::device_count();
    if gpus == 0 {
        return Ok(Device::Cpu);
    }
    if o.local_rank >= gpus {
        return Err(invalid(format!(
            "local rank {} has no GPU of its own (this machine has {gpus}): start at most {gpus} workers per machine, or pass --device cpu",
            o.local_rank
        )));
    }
    Ok(Device::Cuda(o.local_rank))
}

/// Builds the model on the device it is given.
type Build = Arc<dyn Fn(&Device) -> ember::Result<Box<dyn Module>> + Send + Sync>;

/// A data set split for training and testing, the model for it (built by
/// `build` on the device given), and the defaults that suit them.
struct Data {
    x_train: Tensor,
    x_test: Tensor,
    y_train: Tensor,
    y_test: Tensor,
    /// What the samples are, for the first line printed.
    source: String,
    /// The model's name as printed (`ResNet-18`) and as `ember::models` knows it
    /// (`resnet18`).
    model: String,
    name: String,
    classes: usize,
    build: Build,
    /// One sample's shape.
    input: Vec<usize>,
    lr: f64,
    epochs: usize,
    batch: usize,
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::InvalidArgument {
        op: "train",
        msg: msg.into(),
    }
}

fn load(args: &TrainArgs) -> ember::Result<Data> {
    let name = match &args.model {
        Some(m) => m.to_ascii_lowercase(),
        None => match args.dataset {
            Dataset::Iris => "mlp".into(),
            Dataset::Digits => "cnn".into(),
            Dataset::Fake => "resnet18".into(),
            Dataset::Text => unreachable!("the text model is trained by text::run"),
        },
    };
    if !models::NAMES.contains(&name.as_str()) {
        return Err(invalid(format!(
            "--model {name}: unknown model; the models are {}",
            models::NAMES.join(", ")
        )));
    }
    if name == "gpt2_small" {
        // a language model: token ids in, a class per position out
        return Err(invalid(
            "--model gpt2_small is a language model, not an image classifier: `ember train text` \
             trains its layout on text (`--layers 12 --heads 12 --width 768` is GPT-2 small's \
             shape), `ember bench --suite models` times its training step, and `ember estimate \
             --model gpt2_small` gives its memory",
        ));
    }
    // (gpt2_small, the third with blocks, was refused above)
    if args.checkpoint_activations && !models::WITH_BLOCKS.contains(&name.as_str()) {
        return Err(invalid(format!(
            "--checkpoint-activations makes a model's blocks activation checkpoints (resnet18's \
             and resnet50's residual blocks, the text model's transformer blocks); {name} has none"
        )));
    }
    if args.dataset != Dataset::Fake && (args.input.is_some() || args.classes.is_some()) {
        return Err(invalid(
            "--input and --classes set the shape of fake data; iris and digits have their own",
        ));
    }
    let image_model = !matches!(name.as_str(), "mlp" | "cnn");
    if args.dataset != Dataset::Fake && image_model {
        return Err(invalid(format!(
            "--model {name} takes colour images (3xHxW); train it on \
             fake data (`ember train fake --model {name}`), or use mlp or cnn"
        )));
    }
    if args.dataset == Dataset::Fake {
        return fake(args, name);
    }
    let path = data_file(args)?.expect("iris and digits have a data file");
    let (x, y) = match args.dataset {
        Dataset::Iris => data::load_iris(&path)?,
        // pixels 0..16 to 0..1
        _ => {
            let (x, y) = data::load_digits(&path)?;
            (x.div(16.0)?, y)
        }
    };
    let (x_train, x_test, y_train, y_test) = data::train_test_split(&x, &y, 0.2, args.seed)?;
    let (n_train, n_test) = (y_train.numel(), y_test.numel());
    let boxed = |m: ember::Result<nn::Sequential>| m.map(|m| Box::new(m) as Box<dyn Module>);
    let (build, input, x_train, x_test, lr, epochs, batch): (Build, _, _, _, _, _, _) =
        match (args.dataset, name.as_str()) {
            (Dataset::Iris, "mlp") => (
                Arc::new(move |d: &Device| boxed(mlp(&[4, 8, 9, 3], d))),
                vec![4],
                x_train,
                x_test,
                0.01,
                100,
                120,
            ),
            (Dataset::Iris, _) => {
                return Err(invalid("--model cnn needs image data: use it with digits"))
            }
            (_, "mlp") => (
                Arc::new(move |d: &Device| boxed(mlp(&[64, 128, 10], d))),
                vec![64],
                x_train,
                x_test,
                0.01,
                15,
                64,
            ),
            _ => (
                Arc::new(move |d: &Device| boxed(digits_cnn(d))),
                vec![1, 8, 8],
                x_train.reshape([n_train, 1, 8, 8])?,
                x_test.reshape([n_test, 1, 8, 8])?,
                0.001,
                15,
                64,
            ),
        };
    Ok(Data {
        x_train,
        x_test,
        y_train,
        y_test,
        source: path.display().to_string(),
        model: display_name(&name),
        name,
        classes: if args.dataset == Dataset::Iris { 3 } else { 10 },
        build,
        input,
        lr,
        epochs,
        batch,
    })
}

/// How a model is called in print.
fn display_name(name: &str) -> String {
    match name {
        "mlp" => "MLP".into(),
        "cnn" => "CNN".into(),
        "alexnet" => "AlexNet".into(),
        "vgg11" => "VGG-11".into(),
        "vgg16" => "VGG-16".into(),
        "resnet18" => "ResNet-18".into(),
        "resnet50" => "ResNet-50".into(),
        other => other.into(),
    }
}

/// Random images in [0, 1) and random labels (torchvision's `FakeData`), drawn
/// from the seed.
fn fake(args: &TrainArgs, name: String) -> ember::Result<Data> {
    let small = matches!(name.as_str(), "mlp" | "cnn");
    let input = match &args.input {
        Some(s) => parse_shape(s, "train")?,
        None if name == "mlp" => vec![64],
        None if name == "cnn" => vec![1, 8, 8],
        None => vec![3, 224, 224],
    };
    let classes = args.classes.unwrap_or(if small { 10 } else { 1000 }) as usize;
    let n = args.samples as usize;
    let n_test = (n / 5).max(1);
    ember::manual_seed(args.seed);
    let draw = |count: usize| -> ember::Result<(Tensor, Tensor)> {
        let mut shape = vec![count];
        shape.extend_from_slice(&input);
        Ok((
            Tensor::rand(shape.as_slice(), &Device::Cpu)?,
            Tensor::randint(0, classes as i64, [count], &Device::Cpu)?,
        ))
    };
    let (x_train, y_train) = draw(n - n_test)?;
    let (x_test, y_test) = draw(n_test)?;
    let shape: Vec<String> = input.iter().map(|d| d.to_string()).collect();
    let model_name = name.clone();
    let checkpointed = args.checkpoint_activations;
    Ok(Data {
        x_train,
        x_test,
        y_train,
        y_test,
        source: format!("fake data ({} images, {classes} classes)", shape.join("x")),
        model: display_name(&name),
        name,
        classes,
        build: Arc::new(move |d: &Device| {
            if checkpointed {
                models::checkpointed(&model_name, classes, d)
            } else {
                models::by_name(&model_name, classes, d)
            }
        }),
        input,
        lr: 0.001,
        epochs: 1,
        batch: 64,
    })
}

/// Estimates the training step (Adam or SGD, cross-entropy) at `batch` and the
/// evaluation at `eval_batch` on the meta device (which fails, naming the layer,
/// for an input the model cannot take); prints the training estimate with
/// `--estimate`. On a GPU, refuses (with the largest batch that fits) when either
/// does not fit in its free memory, unless `--skip-memory-check`.
fn memory_check(
    args: &TrainArgs,
    data: &Data,
    device: &Device,
    (batch, last): (usize, usize),
    eval_batch: usize,
    lr: f64,
    sgd: bool,
) -> ember::Result<(Estimate, Estimate)> {
    let target = match device {
        Device::Cuda(i) => Some((cuda::mem_get_info(device)?.0, cuda::device_properties(*i)?)),
        _ => None,
    };
    let major = target.as_ref().map_or(9, |(_, p)| p.compute_capability.0);
    let amp = args.amp.map(|a| a.dtype());
    let estimator = || {
        let build = data.build.clone();
        Estimator::new(move |d| build(d))
            .input(&data.input)
            .optimizer(move |p| {
                let o: Box<dyn Optimizer> = if sgd {
                    Box::new(Sgd::new(p, lr)?.momentum(0.9)?)
                } else {
                    Box::new(Adam::new(p, lr)?)
                };
                Ok(o)
            })
            .compute_capability(major)
            .multiprocessors(
                target
                    .as_ref()
                    .map_or(132, |(_, p)| p.multiprocessor_count as usize),
            )
            .cudnn(target.is_none() || cuda::cudnn::is_available())
            .amp(amp)
    };
    // a shape the model cannot take (too small for its pooling, or not what
    // its first layer reads) names --input, as `ember estimate` does
    let input_error = |e: Error| match e {
        Error::ShapeMismatch { .. } | Error::InvalidArgument { .. } if args.input.is_some() => {
            invalid(format!(
                "--input {}: {} cannot take inputs of this shape ({e})",
                args.input.as_deref().unwrap_or_default(),
                data.name
            ))
        }
        e => e,
    };
    let est = estimator();
    let train = est.estimate(batch).map_err(input_error)?;
    // a smaller last batch (without --drop-last) that the model refuses, such as
    // batch norm over one value a channel, would stop the run at its first
    // epoch's end: refused now
    if last > 0 && !args.drop_last {
        if let Err(e) = est.estimate(last) {
            return Err(invalid(format!(
                "the last batch of each epoch holds {last} of the training samples (what \
                 --batch-size {batch} leaves), and the model refuses a batch of {last}: {e}; \
                 pass --drop-last, or choose a --batch-size that leaves more"
            )));
        }
    }
    let eval = estimator()
        .training(false)
        .estimate(eval_batch.min(data.x_test.shape()[0]).max(1))
        .map_err(input_error)?;
    if args.estimate {
        print!("{train}");
    }
    let Some((free, props)) = target else {
        return Ok((train, eval));
    };
    if args.skip_memory_check || (train.fits(free) && eval.fits(free)) {
        return Ok((train, eval));
    }
    let (what, e) = if train.fits(free) {
        ("evaluating", &eval)
    } else {
        ("training", &train)
    };
    let largest = if train.fits(free) {
        None
    } else {
        est.max_batch(batch, free, batch)?
    };
    let advice = match largest {
        Some(b) => format!("the largest batch that fits is {b} (--batch-size {b})"),
        None => "not even a batch of one fits".into(),
    };
    let shape: Vec<String> = data.input.iter().map(|d| d.to_string()).collect();
    let see = match args.dataset {
        // the lesson's 4-8-9-3 network is not one of ember::models
        Dataset::Iris => String::new(),
        _ => format!(
            "; `ember estimate --model {} --input {} --classes {} --optimizer adam \
             --batch-size {} --device {device}` shows where the memory goes",
            data.name,
            shape.join("x"),
            data.classes,
            e.batch_size,
        ),
    };
    Err(invalid(format!(
        "{what} {} at batch {} needs an estimated {} (peak allocated {}, reserved {}), and \
         {device} ({}) has {} free: not started; {advice}{see}; --skip-memory-check trains \
         anyway",
        data.model,
        e.batch_size,
        fmt_bytes(e.required()),
        fmt_bytes(e.peak_allocated),
        fmt_bytes(e.peak_reserved),
        props.name,
        fmt_bytes(free),
    )))
}
