fn main() -> std::process::ExitCode {
    swelake::cli::main()
}
