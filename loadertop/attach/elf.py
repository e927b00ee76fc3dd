"""Just enough ELF to find a few exported symbols of a mapped library, without a debugger.

`loadertop attach` needs the addresses of `Py_AddPendingCall`, `PyRun_SimpleString` (libpython,
or a statically linked python executable) and `mmap` (libc) inside the target. Reading them from
the files' dynamic symbol tables (`.dynsym`, always present in a shared object and in an
executable that exports symbols, as CPython's does) means gdb loads no symbols at all: with
libtorch mapped, gdb's own symbol loading took seconds, during which the target stood still.
Also read here: the value of `Py_Version` (3.11+, a constant in the file), so the Python version
is known before anything touches the target. 64-bit little-endian ELF only (x86-64, aarch64).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

SHT_DYNSYM = 11
SHN_UNDEF = 0
PT_LOAD = 1
ET_EXEC = 2
_SYMBOL = struct.Struct("<IBBHQQ")  # st_name, st_info, st_other, st_shndx, st_value, st_size


class ElfError(Exception):
    pass


@dataclass(frozen=True)
class Symbol:
    name: str
    value: int  # the link-time address (st_value); add the load bias for the runtime one
    size: int


@dataclass(frozen=True)
class Segment:
    vaddr: int
    offset: int
    filesz: int


@dataclass(frozen=True)
class ElfFile:
    path: str
    type: int
    segments: tuple[Segment, ...]  # PT_LOAD
    symbols: dict[str, Symbol]  # the wanted names that are defined in .dynsym

    @property
    def first_load_vaddr(self) -> int:
        """The page-aligned vaddr of the lowest PT_LOAD (its bias base)."""
        lowest = min((s for s in self.segments), key=lambda s: s.vaddr, default=None)
        return (lowest.vaddr & ~0xFFF) if lowest is not None else 0

    def file_offset(self, vaddr: int) -> int | None:
        for seg in self.segments:
            if seg.vaddr <= vaddr < seg.vaddr + seg.filesz:
                return vaddr - seg.vaddr + seg.offset
        return None

    def read_constant(self, name: str, size: int = 8) -> int | None:
        """The initial value of a data symbol, read from the file (a `const` global)."""
        sym = self.symbols.get(name)
        if sym is None:
            return None
        offset = self.file_offset(sym.value)
        if offset is None:
            return None
        with open(self.path, "rb") as fh:
            fh.seek(offset)
            data = fh.read(size)
        if len(data) != size:
            return None
        return int.from_bytes(data, "little")


def read(path: str, wanted: set[str] | frozenset[str]) -> ElfFile:
    """Parse `path`'s header, program headers and dynamic symbols; keep only `wanted` names."""
    try:
        with open(path, "rb") as fh:
            header = fh.read(64)
            if len(header) < 64 or header[:4] != b"\x7fELF":
                raise ElfError(f"{path} is not an ELF file")
            if header[4] != 2 or header[5] != 1:
                raise ElfError(f"{path} is not a 64-bit little-endian ELF file")
            (e_type, _machine, _version, _entry, e_phoff, e_shoff, _flags, _ehsize,
             e_phentsize, e_phnum, e_shentsize, e_shnum, _shstrndx) = struct.unpack_from(
                "<HHIQQQIHHHHHH", header, 16)
            segments = []
            fh.seek(e_phoff)
            table = fh.read(e_phentsize * e_phnum)
            for i in range(e_phnum):
                p_type, _pflags, p_offset, p_vaddr, _paddr, p_filesz, _memsz, _align = \
                    struct.unpack_from("<IIQQQQQQ", table, i * e_phentsize)
                if p_type == PT_LOAD:
                    segments.append(Segment(p_vaddr, p_offset, p_filesz))
            fh.seek(e_shoff)
            sections = fh.read(e_shentsize * e_shnum)
            if len(sections) < e_shentsize * e_shnum:
                raise ElfError(f"{path}: truncated section headers")

            def section(i: int) -> tuple[int, ...]:
                # sh_name, sh_type, sh_flags, sh_addr, sh_offset, sh_size, sh_link, sh_info,
                # sh_addralign, sh_entsize
                return struct.unpack_from("<IIQQQQIIQQ", sections, i * e_shentsize)

            symbols: dict[str, Symbol] = {}
            encoded = {name.encode() for name in wanted}
            for i in range(e_shnum):
                sh = section(i)
                if sh[1] != SHT_DYNSYM or not 0 < sh[6] < e_shnum:
                    continue
                strtab = section(sh[6])
                fh.seek(strtab[4])
                names = fh.read(strtab[5])
                fh.seek(sh[4])
                data = fh.read(sh[5])
                entsize = sh[9] or _SYMBOL.size
                for off in range(0, len(data) - _SYMBOL.size + 1, entsize):
                    st_name, _info, _other, shndx, value, size = _SYMBOL.unpack_from(data, off)
                    if shndx == SHN_UNDEF or not value:
                        continue
                    end = names.find(b"\0", st_name)
                    name = names[st_name:end if end >= 0 else None]
                    if name in encoded and name.decode() not in symbols:
                        symbols[name.decode()] = Symbol(name.decode(), value, size)
    except OSError as exc:
        raise ElfError(f"cannot read {path}: {exc.strerror or exc}") from None
    except struct.error:
        raise ElfError(f"{path}: malformed ELF headers") from None
    return ElfFile(path, e_type, tuple(segments), symbols)


@dataclass(frozen=True)
class Mapping:
    start: int
    offset: int
    path: str


def mappings(pid: int) -> list[Mapping]:
    """The file-backed mappings of `pid` (/proc/PID/maps), in address order."""
    out = []
    with open(f"/proc/{pid}/maps") as fh:
        for line in fh:
            parts = line.split(None, 5)
            if len(parts) < 6 or not parts[5].startswith("/"):
                continue
            start = int(parts[0].split("-", 1)[0], 16)
            out.append(Mapping(start, int(parts[2], 16), parts[5].rstrip("\n")))
    return out


def load_bias(elf_file: ElfFile, maps: list[Mapping], path: str) -> int:
    """Runtime address minus link-time address for the object mapped from `path`: the lowest
    mapping of that file (offset 0) is where its first PT_LOAD went. 0 for a non-PIE executable."""
    if elf_file.type == ET_EXEC:
        return 0
    starts = [m.start for m in maps if m.path == path and m.offset == 0]
    if not starts:
        raise ElfError(f"{path} is not mapped")
    return min(starts) - elf_file.first_load_vaddr
