"""Checks that the built documentation covers the public API (scripts/check-docs.sh runs it).

C: every flatmem_* function the headers include/flatmem/*.h declare (FLATMEM_API) must be
exported by src/flatmem.map's patterns and be in Doxygen's XML with a description; when the
libflatmem that PYTHON's flatmem loads can be found, its exported flatmem_* symbols must be
exactly the declared functions.
Python: every public module of flatmem, flatmem.jax (flatmem_jax) and flatmem.torch must be in
Sphinx's objects.inv, and so must every public name of each: its __all__, or without one the
classes and functions it defines whose names do not start with "_". A name counts as
documented under the module that exports it or where it is defined.
README.md (not part of the Sphinx site): every relative link must name an existing file.

Usage: PYTHON scripts/check_docs.py DOXYGEN_XML_DIR SPHINX_OBJECTS_INV
Prints every missing name and exits 1 if there is any.
"""
import fnmatch
import importlib
import inspect
import io
import pathlib
import importlib.util
import pkgutil
import posixpath
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Packages whose public modules are documented; flatmem.capi, the SWIG module (the C ABI one to
# one), is documented as a module, its names by the C API reference.
PACKAGES = ("flatmem", "flatmem.jax", "flatmem_jax", "flatmem.torch")
NAMES_NOT_CHECKED = {"flatmem.capi"}


def declared_functions():
    names = set()
    for header in sorted(ROOT.glob("include/flatmem/*.h")):
        code = re.sub(r"/\*.*?\*/|//[^\n]*", " ", header.read_text(), flags=re.S)
        names |= set(re.findall(r"\bFLATMEM_API\b[^;{}]*?\b(flatmem_\w+)\s*\(", code))
    return names


def map_patterns():
    text = re.sub(r"/\*.*?\*/", " ", (ROOT / "src/flatmem.map").read_text(), flags=re.S)
    exported = re.search(r"global:(.*?)(?:local:|})", text, re.S).group(1)
    return [p.strip() for p in exported.split(";") if p.strip()]


def described_functions(xml_dir):
    """{function name: whether Doxygen has a description of it}."""
    found = {}
    for path in pathlib.Path(xml_dir).glob("*.xml"):
        for member in ET.parse(path).getroot().iter("memberdef"):
            if member.get("kind") == "function":
                text = "".join("".join(member.find(tag).itertext()) for tag in
                               ("briefdescription", "detaileddescription"))
                name = member.findtext("name")
                found[name] = found.get(name, False) or bool(text.strip())
    return found


def loaded_library():
    """The libflatmem that the imported flatmem extension loads, or None."""
    try:
        import flatmem.capi
        extension = next(p for p in pathlib.Path(flatmem.capi.__file__).parent.glob("_capi*.so"))
        ldd = subprocess.run(["ldd", str(extension)], capture_output=True, text=True).stdout
    except (ImportError, StopIteration, OSError):
        return None
    match = re.search(r"libflatmem\S*\.so\S* => (/\S+)", ldd)
    return pathlib.Path(match.group(1)) if match else None


def exported_symbols(library):
    nm = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True,
                        check=True).stdout
    return {line.split()[-1].split("@")[0] for line in nm.splitlines()
            if line.split() and line.split()[-1].startswith("flatmem_")}


def check_c(xml_dir):
    problems = []
    declared = declared_functions()
    if not declared:
        return ["no FLATMEM_API function found in include/flatmem/*.h (the parser is broken)"]
    patterns = map_patterns()
    problems += [f"C: {n} is declared but src/flatmem.map does not export it" for n in sorted(declared)
                 if not any(fnmatch.fnmatchcase(n, p) for p in patterns)]
    described = described_functions(xml_dir)
    for name in sorted(declared):
        if name not in described:
            problems.append(f"C: {name} is declared but not in Doxygen's XML")
        elif not described[name]:
            problems.append(f"C: {name} has no description in the headers (Doxygen's XML has none)")
    library = loaded_library()
    if library is None:
        print("check-docs: C: no libflatmem found behind PYTHON's flatmem: exports not compared")
    else:
        exported = exported_symbols(library)
        problems += [f"C: {library} exports {n}, which no header declares" for n in sorted(exported - declared)]
        problems += [f"C: {n} is declared but {library} does not export it" for n in sorted(declared - exported)]
    print(f"check-docs: C: {len(declared)} functions declared, {sum(described.get(n, False) for n in declared)} "
          f"described in Doxygen's XML" + (f", {library} compared" if library else ""))
    return problems


def public_modules():
    modules = {}
    for name in PACKAGES:
        package = importlib.import_module(name)
        modules[name] = package
        for info in pkgutil.iter_modules(getattr(package, "__path__", []), name + "."):
            # Python modules only: an installed package also holds shared libraries
            # (flatmem_jax/libflatmem_jax.so, loaded with ctypes) that look like extensions.
            spec = importlib.util.find_spec(info.name)
            python = info.ispkg or (spec is not None and str(spec.origin).endswith(".py"))
            if python and not info.name.rsplit(".", 1)[1].startswith("_"):
                modules[info.name] = importlib.import_module(info.name)
    return modules


def public_names(module):
    if hasattr(module, "__all__"):
        return list(module.__all__)
    return [n for n, obj in vars(module).items() if not n.startswith("_")
            and (inspect.isclass(obj) or inspect.isfunction(obj))
            and getattr(obj, "__module__", None) == module.__name__]


def documented_as(module_name, name, obj, modules):
    """The names under which documenting obj counts."""
    names = {f"{module_name}.{name}"}
    if inspect.ismodule(obj):
        names.add(obj.__name__)
    elif inspect.isclass(obj) or inspect.isfunction(obj):
        names.add(f"{obj.__module__}.{obj.__qualname__}")
    names |= {f"{other}.{name}" for other, module in modules.items() if getattr(module, name, None) is obj}
    return names


def load_inventory(path):
    from sphinx.util.inventory import InventoryFile

    with open(path, "rb") as f:
        inventory = InventoryFile.load(io.BytesIO(f.read()), "", posixpath.join)
    return {name for kind, entries in inventory.items() if kind.startswith("py:") for name in entries}


def check_python(inventory_path):
    problems = []
    documented = load_inventory(inventory_path)
    modules = public_modules()
    checked = 0
    for module_name, module in modules.items():
        if module_name not in documented:
            problems.append(f"Python: module {module_name} is not in the documentation")
        if module_name in NAMES_NOT_CHECKED:
            continue
        for name in public_names(module):
            checked += 1
            obj = getattr(module, name)
            if not documented_as(module_name, name, obj, modules) & documented:
                problems.append(f"Python: {module_name}.{name} is not in the documentation")
    print(f"check-docs: Python: {len(modules)} modules, {checked} public names checked against "
          f"{len(documented)} documented objects")
    return problems


def check_readme_links():
    links = re.findall(r"\]\(([^)\s]+)\)", (ROOT / "README.md").read_text())
    relative = [link.split("#")[0] for link in links if not re.match(r"[a-z]+:|#", link)]
    print(f"check-docs: README.md: {len(relative)} relative links")
    return [f"README.md: the link {link} names no file" for link in relative if not (ROOT / link).exists()]


def main():
    xml_dir, inventory = sys.argv[1:3]
    problems = check_c(xml_dir) + check_python(inventory) + check_readme_links()
    for problem in problems:
        print(f"check-docs: MISSING: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
