//! demo placeholder
use clap::Args;
/// Options of `hoardfs demo`.
#[derive(Args, Debug)]
pub struct DemoArgs {}
/// Runs the demo.
pub fn run(_a: DemoArgs) -> Result<(), String> {
    Err("not yet".into())
}
