#!/usr/bin/env python3
"""The half of the ABI gate (scripts/check-abi.sh) that abidiff's suppressions cannot say.

Reads two abidw corpora (the baseline and the library under test, both written with the public
headers as --headers-dir) and checks, for every public struct:
  1. no padding anywhere in the NEW struct: each member starts where the one before it ends and
     the last one ends at sizeof. Padding is bytes a caller leaves indeterminate, so no later
     library could give them a meaning (fields are appended 8-byte aligned: flatmem.h);
  2. the BASELINE's member list is an exact prefix of the new one: same names, same offsets, same
     types (by name, through typedefs) and sizes, in the same order; the struct did not shrink;
  3. a frozen struct (--frozen REGEX) did not change at all;
for every public enum of the baseline, that each enumerator keeps its name and value (new
enumerators are fine); and for every function of the baseline, that it still exists with the same
return and parameter types, by name (abidiff's struct suppression also matches, vacuously, the diff
of one opaque handle type for another, so `thing_t *` -> `comm_t *` would pass it). abidiff's suppression "fields appended at the end" hides same-size
edits (a swap, int64_t -> double, a field resized into padding); this script is what catches them.
Exit 0 when everything holds, 1 with one line per violation otherwise.
"""
import argparse
import re
import sys
import xml.etree.ElementTree as ET


class Corpus:
    def __init__(self, path):
        self.path = path
        root = ET.parse(path).getroot()
        self.by_id = {}
        self.structs = {}
        self.enums = {}
        self.functions = {}
        for element in root.iter("function-decl"):
            if element.get("elf-symbol-id"):
                self.functions.setdefault(element.get("name"), element)
        for element in root.iter():
            type_id = element.get("id")
            if type_id is not None:
                self.by_id[type_id] = element
        for element in root.iter("class-decl"):
            name = element.get("name")
            if name and element.get("is-declaration-only") != "yes" and not element.get("is-anonymous"):
                self.structs.setdefault(name, element)
        for element in root.iter("enum-decl"):
            name = self.enum_name(element)
            if name:
                self.enums.setdefault(name, element)

    def enum_name(self, element):
        if element.get("is-anonymous") == "yes":
            typedef = self.by_id.get(element.get("naming-typedef-id", ""))
            return typedef.get("name") if typedef is not None else None
        return element.get("name")

    def type_name(self, type_id):
        element = self.by_id.get(type_id)
        if element is None:
            return "?" + type_id
        tag = element.tag
        if tag in ("type-decl", "typedef-decl"):
            return element.get("name")
        if tag == "pointer-type-def":
            return self.type_name(element.get("type-id")) + " *"
        if tag == "qualified-type-def":
            qualifiers = [q for q in ("const", "volatile") if element.get(q) == "yes"]
            return " ".join(qualifiers + [self.type_name(element.get("type-id"))])
        if tag == "array-type-def":
            dims = "".join("[%s]" % (s.get("length") or "") for s in element.iter("subrange"))
            return self.type_name(element.get("type-id")) + dims
        if tag == "class-decl":
            return "struct " + (element.get("name") or "<anonymous>")
        if tag == "union-decl":
            return "union " + (element.get("name") or "<anonymous>")
        if tag == "enum-decl":
            return "enum " + (self.enum_name(element) or "<anonymous>")
        if tag == "function-type":
            return "function"
        return tag

    def type_bits(self, type_id):
        element = self.by_id.get(type_id)
        if element is None:
            return None
        if element.get("size-in-bits"):
            return int(element.get("size-in-bits"))
        if element.tag in ("typedef-decl", "qualified-type-def"):
            return self.type_bits(element.get("type-id"))
        if element.tag == "enum-decl":
            return self.type_bits(element.find("underlying-type").get("type-id"))
        return None

    def members(self, struct):
        """[(name, offset_bits, type_name, size_bits)] in declaration order."""
        out = []
        for member in struct.findall("data-member"):
            var = member.find("var-decl")
            out.append((var.get("name"), int(member.get("layout-offset-in-bits", "0")),
                        self.type_name(var.get("type-id")), self.type_bits(var.get("type-id"))))
        return out


def describe(member):
    name, offset, type_name, bits = member
    return "%s %s at byte %d (%s bytes)" % (type_name, name, offset // 8,
                                             "?" if bits is None else bits // 8)


def padding_problems(corpus, name, struct):
    size = int(struct.get("size-in-bits", "0"))
    problems = []
    end, previous = 0, None
    for member in corpus.members(struct):
        member_name, offset, _, bits = member
        if bits is None:
            problems.append("%s: cannot size member %s" % (name, member_name))
            return problems
        if offset > end:
            problems.append("%s: %d bytes of padding before %s (after %s)"
                            % (name, (offset - end) // 8, member_name, previous or "the start"))
        end, previous = max(end, offset + bits), member_name
    if size > end:
        problems.append("%s: %d bytes of tail padding after %s: append fields 8-byte aligned, or "
                        "name the bytes (a reserved field the library refuses unless zero)"
                        % (name, (size - end) // 8, previous))
    return problems


def evolution_problems(old_corpus, new_corpus, name, frozen):
    old, new = old_corpus.structs[name], new_corpus.structs.get(name)
    if new is None:
        return ["%s: removed (the baseline has it)" % name]
    problems = []
    old_members, new_members = old_corpus.members(old), new_corpus.members(new)
    old_size, new_size = int(old.get("size-in-bits")), int(new.get("size-in-bits"))
    for i, member in enumerate(old_members):
        if i >= len(new_members):
            problems.append("%s: member %d (%s) removed" % (name, i, describe(member)))
            break
        if new_members[i] != member:
            problems.append("%s: member %d was %s, is %s"
                            % (name, i, describe(member), describe(new_members[i])))
    if new_size < old_size:
        problems.append("%s: shrank from %d to %d bytes" % (name, old_size // 8, new_size // 8))
    if frozen.search(name) and (new_size != old_size or len(new_members) != len(old_members)):
        problems.append("%s: frozen, but changed from %d members / %d bytes to %d / %d"
                        % (name, len(old_members), old_size // 8, len(new_members), new_size // 8))
    return problems


def enum_problems(old_corpus, new_corpus, name):
    new = new_corpus.enums.get(name)
    if new is None:
        return ["enum %s: removed" % name]
    new_values = {e.get("name"): e.get("value") for e in new.findall("enumerator")}
    problems = []
    for enumerator in old_corpus.enums[name].findall("enumerator"):
        key, value = enumerator.get("name"), enumerator.get("value")
        if key not in new_values:
            problems.append("enum %s: enumerator %s (= %s) removed" % (name, key, value))
        elif new_values[key] != value:
            problems.append("enum %s: %s changed from %s to %s" % (name, key, value, new_values[key]))
    return problems


def signature(corpus, function):
    parameters = [corpus.type_name(p.get("type-id")) + (" ..." if p.get("is-variadic") == "yes" else "")
                  for p in function.findall("parameter")]
    return "%s %s(%s)" % (corpus.type_name(function.find("return").get("type-id")),
                          function.get("name"), ", ".join(parameters))


def function_problems(old_corpus, new_corpus, name):
    new = new_corpus.functions.get(name)
    if new is None:
        return ["function %s: removed" % name]
    was, now = signature(old_corpus, old_corpus.functions[name]), signature(new_corpus, new)
    return [] if was == now else ["function %s: was %s, is %s" % (name, was, now)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("baseline")
    parser.add_argument("current")
    parser.add_argument("--frozen", default="^$", help="regex of struct names that never change")
    args = parser.parse_args()
    old, new = Corpus(args.baseline), Corpus(args.current)
    frozen = re.compile(args.frozen)
    problems = []
    for name in sorted(new.structs):
        problems += padding_problems(new, name, new.structs[name])
    for name in sorted(old.structs):
        problems += evolution_problems(old, new, name, frozen)
    for name in sorted(old.enums):
        problems += enum_problems(old, new, name)
    for name in sorted(old.functions):
        problems += function_problems(old, new, name)
    for line in problems:
        print("abi-compare: " + line)
    print("abi-compare: %s: %d structs, %d enums, %d functions of %s against %s"
          % ("FAIL" if problems else "OK", len(new.structs), len(new.enums), len(new.functions),
             args.current, args.baseline))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
