//! `wick`: command-line tools for the candle-wick loader.
//!
//! `wick bench DATA` runs the loader over a dataset with no model attached
//! and reports its throughput, per-stage times and peak memory.
//! `wick convert SRC DST` writes a dataset as TFRecord, WebDataset tar or
//! safetensors shards. `wick index DATA` writes a WebDataset's or TFRecord
//! dataset's manifest and per-shard indexes, so that opening it reads no shard.
//! `wick inspect DATA` decodes every sample and lists
//! formats, modes, sizes and every bad file with its reason (exit code 1
//! when any is bad).
//!
//! A dataset is an ImageFolder (a folder of class folders), a file list
//! (`.csv`/`.tsv`), or shards: a `.tfrecord`/`.tfrecord.gz`, `.tar` or
//! `.safetensors` file, or a folder of them.

mod bench;
mod convert;
mod index;
mod inspect;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "wick",
    version,
    about = "Tools for the candle-wick data loader"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Measure loader throughput over a dataset, with no model.
    Bench(bench::BenchArgs),
    /// Write a dataset as TFRecord, WebDataset tar or safetensors shards.
    Convert(convert::ConvertArgs),
    /// Write a WebDataset's or TFRecord dataset's manifest and per-shard indexes
    /// beside its shards, so that opening it reads no shard.
    Index(index::IndexArgs),
    /// Decode every sample; list formats, modes, sizes and bad files.
    Inspect(inspect::InspectArgs),
}

fn report_error(e: &dyn std::error::Error) -> ExitCode {
    eprintln!("wick: {}", candle_wick::error_chain(e));
    ExitCode::FAILURE
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let args = match cli.command {
        Command::Bench(args) => args,
        Command::Convert(args) => {
            return match convert::run_convert(&args) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => report_error(e.as_ref()),
            }
        }
        Command::Index(args) => {
            return match index::run(&args) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => report_error(e.as_ref()),
            }
        }
        Command::Inspect(args) => {
            let report = match inspect::run(&args) {
                Ok(r) => r,
                Err(e) => return report_error(e.as_ref()),
            };
            if args.json {
                match serde_json::to_string_pretty(&report) {
                    Ok(s) => println!("{s}"),
                    Err(e) => return report_error(&e),
                }
            } else {
                inspect::print_text(&report);
            }
            return if inspect::any_bad(&report) {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    if args.sweep {
        return match bench::sweep(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => report_error(e.as_ref()),
        };
    }
    match bench::bench(&args) {
        Ok(r) if args.json => match serde_json::to_string_pretty(&r) {
            Ok(s) => {
                println!("{s}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("wick: {e}");
                ExitCode::FAILURE
            }
        },
        Ok(r) => {
            bench::print_text(&r, args.autotune);
            ExitCode::SUCCESS
        }
        Err(e) => report_error(e.as_ref()),
    }
}
