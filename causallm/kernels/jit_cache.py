"""Where numba keeps the compiled kernels, and a cache that a damaged file cannot break.

numba caches each ``@njit(cache=True)`` function beside its source (``__pycache__``), else in
``~/.cache/numba``, and raises ``cannot cache function ...: no locator available`` at import
when neither is writable (a read-only install run by a service user without a home). Before
any kernel is declared, ``install()`` picks the first writable folder of:

1. ``NUMBA_CACHE_DIR``, when set;
2. ``causallm/kernels/__pycache__`` (numba's default: nothing changes);
3. ``$XDG_CACHE_HOME/causallm/numba``, else ``~/.cache/causallm/numba``;
4. ``<temp dir>/causallm-numba-<uid>``, kept only if this user owns it and nobody else may
   write to it (compiled code from a folder another user controls would run as ours);
5. none: every run compiles the kernels the prebuilt folders (below) do not hold.

Writable means numba's own test: the folder can be made and a file created in it. The choice
(3 or 4) goes to ``NUMBA_CACHE_DIR``, so numba and any child process use it, and one stderr
line says where the cache lives when it is not the default (2) or the user's (1).

numba compiles a kernel once per signature, and an array's signature includes whether it is
writable: ``read_only(a)`` gives the kernels' read-only inputs (weights, biases, tables) one
flag whoever made them (a mapped file, a conversion, an empty default), so each kernel
compiles once rather than once per mix of flags.

``CheckedCache`` is numba's ``FunctionCache`` with two differences: a file it cannot read
back (truncated by a crash or a full disk: numba raises ``EOFError`` or ``UnpicklingError``
from pickle) is a cache miss, and the kernel is compiled and saved again (an index, ``.nbi``,
reads as empty and is written anew; a data file, ``.nbc``, is overwritten by the save of its
entry); and a cache that cannot be written any more costs the cache, not the run.
``install()`` makes every cached dispatcher use it (numba's ``Dispatcher.enable_caching``
creates the function's cache), or numba's ``NullCache`` when no folder is writable.

A cache hit is cheap. numba loads every one of its registries (the typing and lowering of all
it can compile: 0.5-0.7 s, most of a warm start) before it reads a kernel from the cache;
reading one back needs only numba's runtime, so ``CheckedCache`` starts that alone and the
registries load at the first compile, as numba's compiler loads them anyway
(``_known_symbols`` keeps the one case where a cached kernel needs a registry's symbol), and
with them numba's extensions (installed packages' entry points, which numba otherwise looks
for at every kernel's first call: the kernels take arrays and numbers, no extension's types).
That first load imports ``numba.np.arraymath`` without its check for scipy's BLAS
(``_registries_without_scipy``). A cache folder is tested for writing once, not once per
kernel declared (``_tested_once``).

A kernel's machine code is the same whether it was just compiled or read from the cache.
numba links a copy of every kernel a kernel calls into the caller's module, optimizes them
together and exports the copies as weak (``linkonce_odr``) symbols; the JIT binds a weak symbol
to the first definition the process loaded. A process that compiles the caller has compiled the
callee on its own first, so the caller's calls went to that separately optimized copy; a
process that reads the caller from the cache ran the caller's own copy. Under fastmath the two
copies round differently (the parallel attention kernel's ``_attend``: the embedded model's prefill
logits differed by 4e-6). ``install()`` makes every linked-in copy internal once numba has
optimized the module, so a caller always runs its own copies, compiled or loaded; the cache
keys carry ``LINKING`` so code saved under the old rule is not read back. They also carry a
digest of every module of this package (``kernel_sources``): numba's own key is a kernel's
code and its file's time stamp, which let a kernel be read back compiled from helpers in other
files that had changed since.

Kernels compiled ahead of time ship in ``prebuilt/<target>/`` (``tools/prebuild_kernels.py``
writes them): each folder is a numba cache made by a run with ``NUMBA_CPU_NAME`` /
``NUMBA_CPU_FEATURES`` naming a CPU level (``x86-64-v3``: AVX2, FMA, F16C), and its
``target.json`` says which. A folder serves a process whose CPU has every feature of that level
and whose vector operations lower the same way (``simd.LEVEL``, ``simd.F16C``), unless the
process names a target itself. Such a kernel is looked up there first, by numba's own index key
with the level in place of this CPU, and read back as any cached kernel, so the first run of
the embedded model compiles nothing; a kernel the folder lacks, or holds for other sources, a
Python or a numba, is compiled and cached as before. Either way the kernel a process runs is the
same on every run: a prebuilt one is taken whenever there is one.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import stat
import sys
import tempfile

KERNELS = os.path.dirname(os.path.abspath(__file__))


def read_only(a):
    """``a``, or a read-only view of it when it is writable (module docstring)."""
    if a.flags.writeable:
        a = a.view()
        a.flags.writeable = False
    return a


def _writable(folder: str) -> bool:
    """numba's test (``_CacheLocator.ensure_cache_path``): make the folder, create a file."""
    try:
        os.makedirs(folder, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError:
        return False
    return True


def _private(folder: str) -> bool:
    """``folder`` is a directory (not a link) of this user that no one else may write to."""
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        st = os.lstat(folder)
    except OSError:
        return False
    own = not hasattr(os, "getuid") or st.st_uid == os.getuid()
    return stat.S_ISDIR(st.st_mode) and own and not st.st_mode & 0o022


def user_cache_dir(environ=os.environ) -> str | None:
    """``$XDG_CACHE_HOME/causallm/numba``, else ``~/.cache/causallm/numba`` (``~`` from HOME,
    else the password database), or None when neither gives an absolute path."""
    base = environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        home = environ.get("HOME") or os.path.expanduser("~")
        if not os.path.isabs(home):
            return None
        base = os.path.join(home, ".cache")
    return os.path.join(base, "causallm", "numba")


def temp_cache_dir() -> str:
    user = os.getuid() if hasattr(os, "getuid") else os.environ.get("USERNAME", "user")
    return os.path.join(tempfile.gettempdir(), f"causallm-numba-{user}")


def choose(environ=os.environ, in_tree: str = os.path.join(KERNELS, "__pycache__")
           ) -> tuple[str | None, str]:
    """The cache folder (the module docstring's order) and the line to print about it, if
    any: ``""`` is numba's default beside the sources, None no cache at all. Nothing is said
    of the default or of a writable NUMBA_CACHE_DIR."""
    given = environ.get("NUMBA_CACHE_DIR", "")
    if given and _writable(given):
        return given, ""
    why = f"NUMBA_CACHE_DIR {given} is not writable" if given else ""
    if _writable(in_tree):
        return "", f"[numba] {why}: kernels are cached in {in_tree}" if why else ""
    why = "; ".join(filter(None, [why, f"{os.path.dirname(in_tree)} is not writable"]))
    user = user_cache_dir(environ)
    if user and _writable(user):
        return user, f"[numba] {why}: kernels are cached in {user} (NUMBA_CACHE_DIR moves them)"
    temp = temp_cache_dir()
    if _private(temp) and _writable(temp):
        return temp, f"[numba] {why}: kernels are cached in {temp} (NUMBA_CACHE_DIR moves them)"
    return None, (f"[numba] {why}, nor is a user or temporary cache folder: kernels are "
                  f"compiled on every run (set NUMBA_CACHE_DIR to a writable folder)")


CACHED = True
"""False when no cache folder is writable (``install`` found none)."""

LINKING = "callees internal"
"""Part of every cache key: the rule a cached kernel's calls were linked by (module docstring)."""

_sources: str | None = None


def kernel_sources() -> str:
    """Part of every cache key: a digest of every module of this package. numba keys a kernel
    by its own code and its own file's time stamp, so a kernel whose helpers (an intrinsic in
    simd.py, a block function in another file) changed was read back compiled from the old
    ones; with the digest, any change to the kernels compiles them all again. It also carries
    how the vector operations are lowered (``simd.LEVEL``), which is not only the CPU numba
    keys a kernel by: AMX's tiles also need Linux's leave, and a kernel compiled to use them
    must not be read back by a process that may not."""
    global _sources
    if _sources is None:
        from causallm.kernels import simd

        digest = hashlib.sha256(simd.LEVEL.encode())
        for name in sorted(os.listdir(KERNELS)):
            if name.endswith(".py"):
                with open(os.path.join(KERNELS, name), "rb") as f:
                    digest.update(name.encode() + b"\0" + f.read())
        _sources = digest.hexdigest()[:16]
    return _sources


PREBUILT = os.path.join(KERNELS, "prebuilt")
"""Kernels compiled ahead of time, a folder per CPU level (module docstring)."""

_targets: list | None = None


def prebuilt_targets(codegen) -> list[tuple[str, tuple]]:
    """The prebuilt folders this process can run, each with numba's ``magic_tuple`` of its
    target (LLVM triple, CPU name, features): none when NUMBA_CPU_NAME names a target."""
    global _targets
    if _targets is None:
        from numba.core import caching, config

        from causallm.kernels import simd

        _targets = []
        names = sorted(os.listdir(PREBUILT)) if os.path.isdir(PREBUILT) else []
        if not hasattr(caching, "_hash_source_file"):  # a numba before content stamps
            names = []
        host = simd.target_features()
        triple = codegen.magic_tuple()[0]
        for name in names if not config.CPU_NAME else []:
            try:
                with open(os.path.join(PREBUILT, name, "target.json"), "rb") as f:
                    target = json.load(f)
                needs = {f[1:] for f in target["features"].split(",") if f.startswith("+")}
                usable = (target["triple"] == triple and needs <= host
                          and target["level"] == simd.LEVEL and target["f16c"] == simd.F16C)
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                continue  # not a prebuilt folder this version can read
            if usable:
                _targets.append((os.path.join(PREBUILT, name),
                                 (target["triple"], target["cpu"], target["features"])))
    return _targets


class Prebuilt:
    """One kernel's entries in the prebuilt folders (module docstring), found as numba finds
    them in its cache: the file names and source stamp numba's cache gives the kernel, and its
    index key with the folder's target."""

    def __init__(self, py_func):
        self._py_func = py_func

    def load(self, sig, target_context):
        """The kernel's compile result for ``sig`` from a prebuilt folder, or None."""
        from numba.core import caching, compiler

        codegen = target_context.codegen()
        targets = prebuilt_targets(codegen)
        if not targets:
            return None
        source = inspect.getfile(self._py_func)
        st = os.stat(source)
        stamp = caching._hash_source_file(source, st.st_mtime, st.st_size)
        name = (f"{os.path.splitext(os.path.basename(source))[0]}.{self._py_func.__qualname__}"
                .replace("<", "").replace(">", ""))
        base = (f"{name}-{self._py_func.__code__.co_firstlineno}.py{sys.version_info[0]}"
                f"{sys.version_info[1]}{getattr(sys, 'abiflags', '')}")
        key = caching.Cache._index_key(self, sig, codegen) + (LINKING, kernel_sources())
        for folder, magic in targets:
            data = caching.IndexDataCacheFile(folder, base, stamp).load(
                key[:1] + (magic,) + key[2:])
            if data is not None:
                return compiler.CompileResult._rebuild(target_context, *data)
        return None


_said: set = set()


def _say_once(line: str) -> None:
    if line not in _said:
        _said.add(line)
        sys.stderr.write(line + "\n")


def install() -> None:
    """Choose the cache folder, tell numba, and make cached dispatchers use CheckedCache (or
    NullCache). Call once, before any ``@njit(cache=True)`` function is declared."""
    global CACHED
    folder, note = choose()
    if folder:
        os.environ["NUMBA_CACHE_DIR"] = folder
    else:
        os.environ.pop("NUMBA_CACHE_DIR", None)
    CACHED = folder is not None
    if note:
        sys.stderr.write(note + "\n")
        sys.stderr.flush()

    _import_numba()
    from numba.core import caching, codegen, config, cpu, dispatcher
    from numba.core.runtime import rtsys

    config.reload_config()  # numba read the environment when it loaded
    _own_callees(codegen.CPUCodeLibrary)
    _tested_once(caching._CacheLocator)
    _known_symbols(codegen.CPUCodeLibrary)
    _registries_without_scipy(cpu.CPUContext)

    class CheckedIndex(caching.IndexDataCacheFile):
        """An index that cannot be read back is an empty one: the next save writes it anew."""

        def _load_index(self):
            try:
                return super()._load_index()
            except Exception as e:  # noqa: BLE001: whatever pickle makes of a damaged file
                _say_once(f"[numba] cache index {self._index_path} is unreadable "
                          f"({type(e).__name__}); rebuilding it")
                return {}

    class CheckedCache(caching.FunctionCache):
        """numba's function cache with CheckedIndex; an entry that cannot be loaded is a miss
        (the save after the compile overwrites it), and a failed save leaves the kernel
        compiled but not cached."""

        def __init__(self, py_func):
            super().__init__(py_func)
            self._cache_file = CheckedIndex(self._cache_path, self._impl.filename_base,
                                            self._impl.locator.get_source_stamp())
            self._prebuilt = Prebuilt(py_func)

        def load_overload(self, sig, target_context):
            rtsys.initialize(target_context)  # numba refreshes the whole context here
            data = _load_prebuilt(self._prebuilt, sig, target_context)
            if data is not None:
                return data
            try:
                with self._guard_against_spurious_io_errors():
                    return self._load_overload(sig, target_context)
            except Exception as e:  # noqa: BLE001: any unreadable entry is a miss
                _say_once(f"[numba] cache of {self._py_func.__qualname__} in {self._cache_path} "
                          f"is unreadable ({type(e).__name__}); compiling it again")
                return None

        def _index_key(self, sig, codegen):
            return super()._index_key(sig, codegen) + (LINKING, kernel_sources())

        def save_overload(self, sig, data):
            try:
                super().save_overload(sig, data)
            except OSError as e:
                _say_once(f"[numba] cannot save {self._py_func.__qualname__} to "
                          f"{self._cache_path} ({e.strerror or e}); not cached")
                self.disable()

    class PrebuiltOnly(caching.NullCache):
        """No cache folder: kernels come from the prebuilt folders or are compiled."""

        def __init__(self, py_func):
            self._prebuilt = Prebuilt(py_func)

        def load_overload(self, sig, target_context):
            rtsys.initialize(target_context)
            return _load_prebuilt(self._prebuilt, sig, target_context)

    def enable_caching(self):
        self._cache = CheckedCache(self.py_func) if CACHED else PrebuiltOnly(self.py_func)

    dispatcher.Dispatcher.enable_caching = enable_caching
    # numba's extensions (the entry points of installed packages) load with the registries,
    # at the first compile, not at every kernel's first call: a scan of every installed
    # distribution's metadata that a cache hit does not need
    dispatcher.Dispatcher._compilation_chain_init_hook = lambda self: None


def _load_prebuilt(prebuilt: Prebuilt, sig, target_context):
    try:
        return prebuilt.load(sig, target_context)
    except Exception as e:  # noqa: BLE001: an unreadable entry is a miss
        _say_once(f"[numba] prebuilt {prebuilt._py_func.__qualname__} in {PREBUILT} is "
                  f"unreadable ({type(e).__name__}); compiling it")
        return None


def _import_numba() -> None:
    """Import numba without two imports its start makes for nothing here (0.03-0.08 s each):
    scipy, whose version numba's ``__init__`` checks for its linear algebra (no kernel calls
    it), and PyYAML, with which ``numba.core.config`` would read a ``.numba_config.yaml`` in
    the working directory (still imported when that file exists). Either is imported as usual
    by whoever else asks for it."""
    if "numba" in sys.modules:
        return
    names = ["scipy"] + ([] if os.path.isfile(".numba_config.yaml") else ["yaml"])
    blocked = [name for name in names if name not in sys.modules]
    for name in blocked:
        sys.modules[name] = None  # an import of it fails at once
    try:
        import numba  # noqa: F401
    finally:
        for name in blocked:
            del sys.modules[name]


def _own_callees(library_class) -> None:
    """Make numba's ``library_class._optimize_final_module`` (run once per compiled library,
    after the libraries of its callees are linked in) end by giving internal linkage to every
    function it defines that one of those libraries defines too (numba leaves them weak,
    ``linkonce_odr``, or ``weak_odr`` for a parallel loop's gufunc): the library's calls then
    go to its own copies, never to a definition another library loaded first (module
    docstring). Numba's optimization itself is unchanged. Done once per class."""
    optimize = library_class._optimize_final_module
    if getattr(optimize, "owns_callees", False):
        return

    def _optimize_final_module(self):
        optimize(self)
        linked = {fn.name for library in self._linking_libraries
                  for fn in library._get_module_for_linking().functions
                  if not fn.is_declaration}
        for fn in self._final_module.functions:
            if fn.name in linked and not fn.is_declaration:
                fn.linkage = "internal"

    _optimize_final_module.owns_callees = True
    library_class._optimize_final_module = _optimize_final_module


def _tested_once(locator_class) -> None:
    """Make numba's ``locator_class.ensure_cache_path`` (make the folder, create and delete a
    file in it: run for every cached function as it is declared, about 100 at the kernels'
    import, and before every save) test a folder once per process: a folder that passed is
    taken as writable from then on (a save that fails all the same leaves that kernel
    uncached, ``CheckedCache.save_overload``). Done once per class."""
    ensure = locator_class.ensure_cache_path
    if getattr(ensure, "tested_once", False):
        return
    tested: set = set()

    def ensure_cache_path(self):
        path = self.get_cache_path()
        if path not in tested:
            ensure(self)
            tested.add(path)

    ensure_cache_path.tested_once = True
    locator_class.ensure_cache_path = ensure_cache_path


def _known_symbols(library_class) -> None:
    """Make numba's ``library_class._unserialize`` (a cached kernel read back) first load
    numba's registries (``cpu_target.target_context.refresh()``, what numba itself runs before
    every cache load) when the kernel's code names a symbol that only their loading gives LLVM,
    and the process has not loaded it yet: ``numba.cpython.hashing`` adds the hash secret
    (``_numba_hashsecret_*``, read by ``hash`` of a string) as it is imported; code naming a
    symbol LLVM does not know aborts the process when it is linked. (Unpickling such an entry
    usually imports the module already, for the types its signature names: this is the
    guard.) Every other symbol a kernel names is known once numba's runtime has started
    (``CheckedCache.load_overload``), or is a parallel kernel's thread pool, which the cached
    entry starts itself. So the kernels on the path to a first token bind in milliseconds each
    rather than after 0.5-0.7 s of registry loading (docs/performance.md). Done once per
    class."""
    unserialize = library_class.__dict__["_unserialize"].__func__
    if getattr(unserialize, "knows_symbols", False):
        return

    def _unserialize(cls, codegen, state):
        _, kind, data = state
        parts = (data,) if kind == "bitcode" else data  # (object code, bitcode): names as bytes
        if (any(b"_numba_hashsecret_" in part for part in parts)
                and "numba.cpython.hashing" not in sys.modules):
            from numba.core.registry import cpu_target

            cpu_target.target_context.refresh()
        return unserialize(cls, codegen, state)

    _unserialize.knows_symbols = True
    library_class._unserialize = classmethod(_unserialize)


def _registries_without_scipy(context_class) -> None:
    """Make the first ``context_class.load_additional_registries`` (numba loading its
    registries, before the first compile) import ``numba.np.arraymath`` without its check for
    scipy's BLAS: that check imports ``scipy.linalg``, 0.3-0.9 s where scipy is installed, for
    ``np.dot`` inside jitted code, which no kernel here calls (its answer is then "no BLAS" for
    numba code in this process). When scipy's linear algebra is already loaded, the check runs
    as usual. Done once per class."""
    load = context_class.load_additional_registries
    if getattr(load, "without_scipy", False):
        return

    def load_additional_registries(self):
        if "scipy.linalg" in sys.modules or "numba.np.arraymath" in sys.modules:
            return load(self)
        sys.modules["scipy.linalg.cython_blas"] = None  # the import the check tries: fails at once
        try:
            import numba.np.arraymath  # noqa: F401
        finally:
            del sys.modules["scipy.linalg.cython_blas"]
        return load(self)

    load_additional_registries.without_scipy = True
    context_class.load_additional_registries = load_additional_registries
