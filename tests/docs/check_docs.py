#!/usr/bin/python3
"""Documentation that cannot rot: checks README.md and docs/*.md against the code (Python standard library only).

  check_docs.py links     ROOT                    every relative link and #anchor resolves (GitHub's anchor rules)
  check_docs.py commands  ROOT PRETRAIN           every bridge-pretrain line of a ```sh/```bash block resolves
  check_docs.py reference ROOT PRETRAIN           docs/config-reference.md is what `--help-markdown` prints now
  check_docs.py examples  ROOT BUILD WORK CXX     every ```cpp block with `int main` compiles against the installed
                                                  package; the README's programs also run

A bridge-pretrain line runs with --print-config appended, in ROOT, with PRETRAIN (the built binary) in place of the
documented path. `commands` takes the lines of the pages' ```sh/```bash blocks, the indented command lines in the
comments of examples/recipes/*.yaml, and the command lines `PRETRAIN --help` prints: every launch line the product
shows a user. A line under torchrun or mpirun runs whole, through that launcher as written (so `torchrun` without
`--no_python`, or Debian's torchrun 1.13, fails as it would for the user; bridge-pretrain's --print-config under a
launcher checks the config against the world size and joins the world); as root, mpirun gets --allow-run-as-root
and --oversubscribe when the line lacks them (the pages say to add them). A line ending in `# docs: skip (why)` is not
run. Exit status: 0 when every check passes, 1 otherwise (each failure names the file and line).
"""
import concurrent.futures
import difflib
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)")
SHELL_LANGUAGES = {"sh", "bash", "shell"}
SKIP_MARK = re.compile(r"#\s*docs:\s*skip\b")
REGENERATE = "build/tools/bridge-pretrain --help-markdown > docs/config-reference.md"


def pages(root):
    """README.md and every docs/*.md, as paths."""
    return [root / "README.md"] + sorted((root / "docs").glob("*.md"))


def blocks(path):
    """Yields (language, first line number, lines) for each fenced block of `path`."""
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        fence, language, start = match.group(2), match.group(3).lower(), i + 1
        i += 1
        body = []
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        i += 1
        yield language, start + 1, body


def prose(path):
    """Yields (line number, text with code spans blanked, text) for the lines of `path` outside fenced blocks."""
    in_fence = None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        match = FENCE.match(line)
        if match and in_fence is None:
            in_fence = match.group(2)
            continue
        if in_fence is not None:
            if line.strip().startswith(in_fence):
                in_fence = None
            continue
        yield number, re.sub(r"(`+)(.+?)\1", lambda m: " " * len(m.group(0)), line), line


# ---- links ----

LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def anchor(heading):
    """GitHub's anchor of a heading: its text as rendered, lowercased, punctuation dropped, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link shows its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML shows nothing
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)  # \w keeps letters, digits and '_' (also non-ASCII letters)
    return text.replace(" ", "-")


def anchors(path, cache={}):
    """Every anchor of `path`'s headings; a repeated one gets -1, -2, ... as on GitHub."""
    if path not in cache:
        seen, result = {}, set()
        for _, _, line in prose(path) if path.suffix == ".md" else []:
            match = HEADING.match(line)
            if not match:
                continue
            base = anchor(match.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            result.add(base if count == 0 else f"{base}-{count}")
        cache[path] = result
    return cache[path]


def check_links(root):
    failures, checked = [], 0
    for page in pages(root):
        for number, blanked, line in prose(page):
            for match in LINK.finditer(blanked):  # a link inside a code span is code, not a link
                target = line[match.start(1) : match.end(1)]
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
                    continue
                checked += 1
                where = f"{page.relative_to(root)}:{number}: link '{target}'"
                file_part, _, fragment = target.partition("#")
                destination = (page.parent / file_part).resolve() if file_part else page
                if not destination.exists():
                    failures.append(f"{where}: {destination} does not exist")
                    continue
                if fragment and fragment not in anchors(destination):
                    known = sorted(anchors(destination))
                    close = difflib.get_close_matches(fragment, known, n=3)
                    hint = f"; did you mean {', '.join('#' + a for a in close)}?" if close else (
                        f"; its anchors: {', '.join('#' + a for a in known[:8])}" if known else "; it has no headings")
                    failures.append(f"{where}: no heading with anchor #{fragment} in {destination.name}{hint}")
    return failures, f"{checked} relative links"


# ---- bridge-pretrain commands ----


def logical_lines(body, first_number):
    """Joins backslash continuations: yields (line number, text)."""
    pending, start = "", None
    for offset, line in enumerate(body):
        if start is None:
            start = first_number + offset
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        yield start, pending + line
        pending, start = "", None
    if pending:
        yield start, pending


def expand(token, variables):
    return re.sub(r"\$\{?(\w+)\}?", lambda m: variables.get(m.group(1), m.group(0)), token)


LAUNCHERS = {"torchrun", "mpirun", "mpiexec"}


def pretrain_command(text, variables, prose_too=False):
    """(launcher, arguments) of the bridge-pretrain command on one shell line, or None when it runs none: `launcher` is
    the tokens before bridge-pretrain (empty when it runs alone), `arguments` those after it. Simple assignments
    (`B=build/tools/bridge-pretrain;`) are remembered in `variables` for the lines after. `prose_too`: the line may be
    a sentence (--help, a recipe's comment), which is not a command unless a launcher or the program starts it."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|<>()")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    tokens = list(lexer)
    launcher, arguments = [], None
    for token in tokens:
        assignment = re.fullmatch(r"([A-Za-z_]\w*)=(.*)", token)
        if arguments is None and assignment and "$(" not in token and not launcher:
            variables[assignment.group(1)] = expand(assignment.group(2), variables)
            continue
        if re.fullmatch(r"[;&|<>()]+", token):
            if arguments is not None:
                break
            launcher = []  # a new command starts
            continue
        if arguments is not None:
            arguments.append(expand(token, variables))
        elif os.path.basename(expand(token, variables)) == "bridge-pretrain":
            arguments = []
        else:
            launcher.append(expand(token, variables))
    if arguments is None:
        return None
    if launcher and os.path.basename(launcher[0]) not in LAUNCHERS:
        if prose_too:
            return None  # prose that names the program ("Run bridge-pretrain ..."), not a command
        launcher = []  # `time`, `nohup`, `env X=1`, `srun`: the program's own part runs
    if any(argument.startswith("[") for argument in arguments):
        return None  # a synopsis: "bridge-pretrain [--config RECIPE.yaml] [KEY=VALUE ...]"
    return launcher, arguments


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_print_config(pretrain, command, root):
    """Runs one documented command, (launcher, arguments), with --print-config; returns None when it resolves, else
    why not."""
    launcher, arguments = list(command[0]), list(command[1])
    environment = None
    if launcher:
        if os.path.basename(launcher[0]) in {"mpirun", "mpiexec"} and os.geteuid() == 0:
            launcher[1:1] = [flag for flag in ("--allow-run-as-root", "--oversubscribe") if flag not in launcher]
        # A world of its own: no variables of an enclosing launcher, and torchrun's store on a free port rather than
        # 29500, which another test may hold.
        outer = re.compile(r"(RANK|WORLD_SIZE|LOCAL_|MASTER_|GROUP_|ROLE_|TORCHELASTIC_|OMPI_|PMI_|PMIX_|SLURM_)")
        environment = {k: v for k, v in os.environ.items() if not outer.match(k)}
        environment["PET_MASTER_PORT"] = str(free_port())
        environment.setdefault("OMP_NUM_THREADS", "1")
    command = launcher + [pretrain] + arguments + ["--print-config"]
    # A session of its own: on a timeout the whole group goes (a launcher's ranks too, not only the launcher).
    try:
        process = subprocess.Popen(command, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   env=environment, start_new_session=True)
    except OSError as error:
        return f"cannot start: {shlex.join(command)}: {error}"
    try:
        stdout, stderr = process.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return f"timed out: {shlex.join(command)}"
    if process.returncode == 0:
        return None
    output = (stderr.strip() or stdout.strip())[-3000:].replace("\n", "\n    ")
    return f"exit {process.returncode}: {shlex.join(command)}\n    {output}"


def recipe_comment_lines(path):
    """Yields (line number, text) for the indented command lines in the comments of a recipe (`#   bridge-pretrain
    ...`, continued by a trailing backslash)."""
    pending, start = "", None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        match = re.match(r"^#(\s{2,}\S.*)$", line)
        if match is None:
            if pending:
                yield start, pending
            pending, start = "", None
            continue
        text = match.group(1).strip()
        if start is None:
            start = number
        if text.endswith("\\"):
            pending += text[:-1] + " "
            continue
        yield start, pending + text
        pending, start = "", None
    if pending:
        yield start, pending


def help_lines(pretrain):
    """Yields (line number, text) for the lines `pretrain --help` prints (continuations joined)."""
    result = subprocess.run([pretrain, "--help"], capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise RuntimeError(f"{pretrain} --help exited {result.returncode}: {result.stderr}")
    body = [line for line in result.stdout.splitlines()]
    yield from logical_lines([line.strip() for line in body], 1)


def check_commands(root, pretrain):
    failures, commands = [], {}  # (launcher, arguments) -> where they are shown

    def collect(where, text, variables, prose_too=False):
        try:
            command = pretrain_command(text, variables, prose_too)
        except ValueError:  # shlex: an apostrophe in a sentence of --help or a comment
            if not prose_too:
                raise
            return
        if command is None or SKIP_MARK.search(text):
            return
        launcher, arguments = command
        unresolved = [a for a in launcher + arguments if "$" in a]
        if unresolved:
            failures.append(f"{where}: cannot resolve {unresolved} (set the variable in the block, or end the "
                            "line with '# docs: skip (why)')")
            return
        commands.setdefault((tuple(launcher), tuple(arguments)), []).append(where)

    for page in pages(root):
        for language, first, body in blocks(page):
            if language not in SHELL_LANGUAGES:
                continue
            variables = {}
            for number, text in logical_lines(body, first):
                collect(f"{page.relative_to(root)}:{number}", text, variables)
    for recipe in sorted((root / "examples" / "recipes").glob("*.yaml")):
        for number, text in recipe_comment_lines(recipe):
            collect(f"{recipe.relative_to(root)}:{number}", text, {}, prose_too=True)
    for number, text in help_lines(pretrain):
        collect(f"bridge-pretrain --help, line {number}", text, {}, prose_too=True)

    def check(items):
        outcomes = pool.map(lambda command: run_print_config(pretrain, command, root), [c for c, _ in items])
        for (_, places), outcome in zip(items, outcomes):
            if outcome is not None:
                failures.extend(f"{where}: {outcome}" for where in places)

    alone = [(c, w) for c, w in commands.items() if not c[0]]
    launched = [(c, w) for c, w in commands.items() if c[0]]
    # A run alone is mostly LibTorch's start-up: side by side, each distinct command once. A launched one starts
    # several ranks itself: one at a time.
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        check(alone)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        check(launched)
    return failures, (f"{sum(map(len, commands.values()))} bridge-pretrain commands ({len(alone)} distinct alone, "
                      f"{len(launched)} under a launcher)")


# ---- the generated config reference ----


def check_reference(root, pretrain):
    result = subprocess.run([pretrain, "--help-markdown"], capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        return [f"{pretrain} --help-markdown exited {result.returncode}: {result.stderr}"], ""
    page = root / "docs" / "config-reference.md"
    committed = page.read_text(encoding="utf-8") if page.exists() else ""
    if committed == result.stdout:
        return [], "docs/config-reference.md is current"
    diff = difflib.unified_diff(committed.splitlines(), result.stdout.splitlines(), "docs/config-reference.md",
                                "bridge-pretrain --help-markdown", lineterm="", n=1)
    shown = "\n".join(list(diff)[:40])
    return [f"docs/config-reference.md differs from what the binary prints now; regenerate it with\n    {REGENERATE}\n"
            f"{shown}"], ""


# ---- C++ programs ----

PROJECT = """# Generated by tests/docs/check_docs.py: the documentation's C++ programs, built against the installed
# package.
cmake_minimum_required(VERSION 3.22)
project(bridge_docs_examples LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 17)
# -O0: the programs only need to compile and, for a few steps, run: their time is spent inside LibTorch, which is
# optimised, while optimising their own code (pretrain()'s templates) would cost most of the build.
set(CMAKE_CXX_FLAGS_DEBUG "-O0")
find_package(bridge REQUIRED)
set(pch_options)
if(CMAKE_CXX_COMPILER_LAUNCHER AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  set(pch_options -fpch-preprocess)  # lets ccache see through the precompiled header
endif()
"""
PROGRAM = """add_executable({name} {name}.cpp)
target_link_libraries({name} PRIVATE bridge::bridge)
target_compile_options({name} PRIVATE ${{pch_options}})
"""
# With many programs the first precompiles <bridge/bridge.h> and the others reuse it. Measured on 2 cores: a program
# takes ~18 s of CPU alone, ~9 s with the header precompiled, which takes ~35 s and runs before any of them, so the
# header pays for itself past about 8 programs.
PRECOMPILE_FROM = 8
PCH_FIRST = "target_precompile_headers({name} PRIVATE <bridge/bridge.h>)\n"
PCH_REUSE = "target_precompile_headers({name} REUSE_FROM {first})\n"


def run(command, what, **kwargs):
    result = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        raise RuntimeError(f"{what} failed ({result.returncode}): {shlex.join(map(str, command))}\n"
                           f"{result.stdout[-6000:]}{result.stderr[-6000:]}")
    return result


def check_examples(root, build, work, compiler):
    programs = []  # (name, where, runs)
    source_dir = work / "examples"
    source_dir.mkdir(parents=True, exist_ok=True)
    for page in pages(root):
        for language, first, body in blocks(page):
            text = "\n".join(body) + "\n"
            if language not in {"cpp", "c++"} or not re.search(r"\bint\s+main\s*\(", text):
                continue
            name = re.sub(r"\W", "_", f"{page.stem}_{first}").lower()
            programs.append((name, f"{page.relative_to(root)}:{first}", page.name == "README.md"))
            source = source_dir / f"{name}.cpp"
            # #line: the compiler's messages then name the page and its line.
            relative = page.relative_to(root)
            header = f"// {relative}, the block from line {first}\n#line {first} \"{relative}\"\n"
            if not source.exists() or source.read_text() != header + text:  # unchanged: not rebuilt
                source.write_text(header + text)
    if not programs:
        return [], "no C++ programs"
    for stale in set(source_dir.glob("*.cpp")) - {source_dir / f"{n}.cpp" for n, _, _ in programs}:
        stale.unlink()
    project = PROJECT
    for index, (name, _, _) in enumerate(programs):
        project += PROGRAM.format(name=name)
        if len(programs) >= PRECOMPILE_FROM:
            project += (PCH_REUSE if index else PCH_FIRST).format(name=name, first=programs[0][0])
    (source_dir / "CMakeLists.txt").write_text(project)

    started = time.monotonic()
    # The build tree installed as a user would install it (only what changed is copied again).
    run(["cmake", "--install", build, "--prefix", work / "prefix"], "installing the build tree")
    installed = time.monotonic()
    configure = ["cmake", "-S", source_dir, "-B", work / "build", "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Debug",
                 f"-DCMAKE_PREFIX_PATH={work / 'prefix'}", f"-DCMAKE_CXX_COMPILER={compiler}"]
    ccache = shutil.which("ccache")
    if ccache:
        configure.append(f"-DCMAKE_CXX_COMPILER_LAUNCHER={ccache}")
    run(configure, "configuring the examples' project")
    configured = time.monotonic()
    failures = []
    jobs = str(os.cpu_count() or 2)
    environment = dict(os.environ, CCACHE_SLOPPINESS="pch_defines,time_macros,include_file_mtime,include_file_ctime")
    result = subprocess.run(["cmake", "--build", work / "build", "-j", jobs, "--", "-k", "0"], capture_output=True,
                            text=True, env=environment)
    if result.returncode != 0:
        # Ninja prints each failed command's output after its "FAILED: <output file>" line.
        sections = re.split(r"^FAILED: ", result.stdout + result.stderr, flags=re.MULTILINE)
        for name, where, _ in programs:
            for section in sections[1:]:
                if not re.match(rf"\S*\b{name}\b", section):
                    continue
                errors = [line for line in section.splitlines() if ": error:" in line or "error:" in line[:12]]
                failures.append(f"{where}: does not build against the installed package:\n    " +
                                "\n    ".join(errors[:10] or section.splitlines()[-20:]))
        if not failures:
            failures.append("building the examples failed:\n" + (result.stdout + result.stderr)[-6000:])
    built = time.monotonic()
    for name, where, runs in programs:
        if not runs or any(f.startswith(where + ":") for f in failures):
            continue
        program = work / "build" / name
        scratch = work / "run" / name
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(parents=True)
        launcher = re.compile(r"(RANK|WORLD_SIZE|LOCAL_|MASTER_|OMPI_|PMI_|SLURM_)")  # a world of one
        environment = {k: v for k, v in os.environ.items() if not launcher.match(k)}
        # OpenMP threads that spin while they wait make a tiny run 3-20x slower on a busy machine (measured here:
        # 1 s passive against 4-22 s spinning, other builds running).
        environment.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        try:
            result = subprocess.run([program], cwd=scratch, capture_output=True, text=True, timeout=120,
                                    env=environment)
        except subprocess.TimeoutExpired:
            failures.append(f"{where}: the program ran past 120 s")
            continue
        if result.returncode != 0:
            output = (result.stdout + result.stderr)[-4000:]
            failures.append(f"{where}: the program exited {result.returncode}:\n{output}")
    ran = sum(1 for _, _, runs in programs if runs)
    ran_for = time.monotonic() - built
    return failures, (f"{len(programs)} C++ programs, {ran} run; install {installed - started:.0f} s, configure "
                      f"{configured - installed:.0f} s, build {built - configured:.0f} s, run {ran_for:.0f} s")


def main(argv):
    usage = __doc__.split("\n\n")[1]
    if len(argv) < 3:
        print(usage, file=sys.stderr)
        return 2
    mode, root = argv[1], Path(argv[2]).resolve()
    started = time.monotonic()
    try:
        if mode == "links" and len(argv) == 3:
            failures, summary = check_links(root)
        elif mode == "commands" and len(argv) == 4:
            failures, summary = check_commands(root, argv[3])
        elif mode == "reference" and len(argv) == 4:
            failures, summary = check_reference(root, argv[3])
        elif mode == "examples" and len(argv) == 6:
            failures, summary = check_examples(root, Path(argv[3]).resolve(), Path(argv[4]).resolve(), argv[5])
        else:
            print(usage, file=sys.stderr)
            return 2
    except (RuntimeError, OSError, subprocess.SubprocessError) as error:
        failures, summary = [str(error)], ""
    for failure in failures:
        print(f"FAIL {failure}")
    print(f"check_docs.py {mode}: {len(failures)} failure(s); {summary} ({time.monotonic() - started:.1f} s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
