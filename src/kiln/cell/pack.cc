// Cell packing: a hand-written ustar writer and a strict reader (cell layer; see pack.h).
//
// Why by hand: the archive is the cell's identity (its digest is the ref), so every byte must be
// ours to decide (law 15), and the reader must refuse on the first odd header rather than guess
// the way general-purpose tar libraries do. Header layout (POSIX.1-1988 ustar, 512 bytes):
//   0 name[100]  100 mode[8]  108 uid[8]  116 gid[8]  124 size[12]  136 mtime[12]
//   148 chksum[8]  156 typeflag  157 linkname[100]  257 magic "ustar\0"  263 version "00"
//   265 uname[32]  297 gname[32]  329 devmajor[8]  337 devminor[8]  345 prefix[155]  500 pad[12]
// Numeric fields are zero-padded octal followed by a NUL; chksum is the unsigned byte sum of the
// header with the chksum field read as eight spaces, written as six octal digits, NUL, space.
#include "src/kiln/cell/pack.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "src/kiln/base/sha256.h"

namespace kiln {

namespace {

constexpr size_t kBlock = 512;

struct MemberSpec {
  const char* name;
  uint64_t max_bytes;
  std::string CellFiles::*field;
  MemberSpan CellLayout::*span;
};

// The members of a cell, in archive order.
constexpr std::array<MemberSpec, 3> kMembers = {{
    {"metadata.json", kMaxMetadataBytes, &CellFiles::metadata_json, &CellLayout::metadata},
    {"cell.so", kMaxSharedObjectBytes, &CellFiles::shared_object, &CellLayout::shared_object},
    {"source/cell.cc", kMaxSourceBytes, &CellFiles::source, &CellLayout::source},
}};

// Writes `value` as `width - 1` zero-padded octal digits and a NUL.
void PutOctal(char* field, size_t width, uint64_t value) {
  std::memset(field, '0', width - 1);
  field[width - 1] = '\0';
  for (size_t i = width - 1; i > 0 && value != 0; --i) {
    field[i - 1] = static_cast<char>('0' + (value & 7));
    value >>= 3;
  }
}

uint64_t HeaderSum(const unsigned char* h) {
  uint64_t sum = 0;
  for (size_t i = 0; i < kBlock; ++i) sum += (i >= 148 && i < 156) ? ' ' : h[i];
  return sum;
}

std::string Header(const std::string& name, uint64_t size) {
  std::string h(kBlock, '\0');
  std::memcpy(h.data(), name.data(), name.size());  // REQUIRES: name.size() < 100
  PutOctal(&h[100], 8, 0644);
  PutOctal(&h[108], 8, 0);  // uid
  PutOctal(&h[116], 8, 0);  // gid
  PutOctal(&h[124], 12, size);
  PutOctal(&h[136], 12, 0);  // mtime: fixed, no wall clock in a cell
  h[156] = '0';              // regular file
  std::memcpy(&h[257],
              "ustar\0"
              "00",
              8);
  PutOctal(&h[329], 8, 0);  // devmajor
  PutOctal(&h[337], 8, 0);  // devminor
  const uint64_t sum = HeaderSum(reinterpret_cast<const unsigned char*>(h.data()));
  PutOctal(&h[148], 7, sum);  // six digits and a NUL
  h[155] = ' ';
  return h;
}

size_t Padding(uint64_t size) { return static_cast<size_t>((kBlock - size % kBlock) % kBlock); }

// Parses an octal numeric field: optional leading spaces, octal digits, then NULs or spaces to
// the end of the field. nullopt-like failure is reported through `ok`.
bool ParseOctal(const unsigned char* field, size_t width, uint64_t* out) {
  size_t i = 0;
  while (i < width && field[i] == ' ') ++i;
  uint64_t v = 0;
  size_t digits = 0;
  for (; i < width && field[i] >= '0' && field[i] <= '7'; ++i, ++digits) {
    if (v > (UINT64_MAX >> 3)) return false;
    v = (v << 3) | static_cast<uint64_t>(field[i] - '0');
  }
  if (digits == 0) return false;
  for (; i < width; ++i) {
    if (field[i] != '\0' && field[i] != ' ') return false;
  }
  *out = v;
  return true;
}

// A NUL-terminated field that may fill its whole width without a NUL.
std::string FieldString(const unsigned char* field, size_t width) {
  const void* nul = std::memchr(field, '\0', width);
  const size_t n =
      nul ? static_cast<size_t>(static_cast<const unsigned char*>(nul) - field) : width;
  return std::string(reinterpret_cast<const char*>(field), n);
}

bool AllZero(const unsigned char* p, size_t n) {
  return std::all_of(p, p + n, [](unsigned char c) { return c == 0; });
}

const char* TypeflagName(unsigned char t) {
  switch (t) {
    case '1':
      return "a hard link";
    case '2':
      return "a symbolic link";
    case '3':
      return "a character device";
    case '4':
      return "a block device";
    case '5':
      return "a directory";
    case '6':
      return "a FIFO";
    case '7':
      return "a contiguous file";
    case 'x':
    case 'g':
      return "a pax extended header";
    case 'L':
    case 'K':
      return "a GNU long-name header";
    default:
      return "an unknown member type";
  }
}

// Printable rendering of an untrusted name for messages.
std::string Printable(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      static const char* kHex = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

bool HasDotDot(const std::string& path) {
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    if (path.compare(start, end - start, "..") == 0 && end - start == 2) return true;
    start = end + 1;
  }
  return false;
}

}  // namespace

Result<std::string> PackCell(const CellFiles& files) {
  uint64_t total = 2 * kBlock;
  for (const MemberSpec& m : kMembers) {
    const uint64_t size = (files.*m.field).size();
    if (size > m.max_bytes) {
      return Status::InvalidArgument("cell member '" + std::string(m.name) + "' is " +
                                     std::to_string(size) + " bytes, over its limit of " +
                                     std::to_string(m.max_bytes));
    }
    total += kBlock + size + Padding(size);
  }
  std::string out;
  out.reserve(static_cast<size_t>(total));
  for (const MemberSpec& m : kMembers) {
    const std::string& bytes = files.*m.field;
    out += Header(m.name, bytes.size());
    out += bytes;
    out.append(Padding(bytes.size()), '\0');
  }
  out.append(2 * kBlock, '\0');
  return out;
}

Result<CellLayout> IndexCell(const ArchiveReader& read_at, uint64_t total,
                             const std::string& what) {
  auto corrupt = [&](const std::string& msg) { return Status::Corruption(what + ": " + msg); };
  // Reads exactly `n` bytes at `at` (the caller checked they are inside the archive).
  auto read_exact = [&](uint64_t at, unsigned char* out, size_t n) -> Status {
    size_t got = 0;
    while (got < n) {
      KILN_ASSIGN_OR_RETURN(size_t k,
                            read_at(at + got, reinterpret_cast<char*>(out) + got, n - got));
      if (k == 0) {
        return Status::IOError(what + ": the archive ended at offset " + std::to_string(at + got) +
                               " though it is " + std::to_string(total) + " bytes long");
      }
      got += k;
    }
    return Status::OK();
  };

  CellLayout layout;
  std::array<bool, kMembers.size()> seen{};
  std::array<unsigned char, kBlock> header{};
  const unsigned char* h = header.data();
  uint64_t off = 0;
  while (true) {
    if (total - off < kBlock) {
      return corrupt("truncated archive: " + std::to_string(total - off) +
                     " bytes left at offset " + std::to_string(off) +
                     " where a 512-byte header or end block was expected");
    }
    KILN_RETURN_IF_ERROR(read_exact(off, header.data(), kBlock));
    if (AllZero(h, kBlock)) {
      // End of archive: a second zero block, then nothing but zero bytes.
      if (total - off - kBlock < kBlock) {
        return corrupt("truncated archive: the end-of-archive marker at offset " +
                       std::to_string(off) + " has one zero block, expected two");
      }
      std::array<unsigned char, 64 * 1024> tail{};
      for (uint64_t at = off + kBlock; at < total;) {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(tail.size(), total - at));
        KILN_RETURN_IF_ERROR(read_exact(at, tail.data(), n));
        if (!AllZero(tail.data(), n)) {
          const uint64_t bad =
              at + static_cast<uint64_t>(std::find_if(tail.data(), tail.data() + n,
                                                      [](unsigned char c) { return c != 0; }) -
                                         tail.data());
          return corrupt("non-zero trailing data at offset " + std::to_string(bad) +
                         " after the end-of-archive marker at offset " + std::to_string(off));
        }
        at += n;
      }
      break;
    }

    uint64_t recorded_sum = 0;
    const uint64_t sum = HeaderSum(h);
    if (!ParseOctal(h + 148, 8, &recorded_sum) || recorded_sum != sum) {
      return corrupt("bad header checksum at offset " + std::to_string(off) + ": field reads '" +
                     Printable(FieldString(h + 148, 8)) + "', header sums to " +
                     std::to_string(sum) + " (octal fields expected)");
    }
    if (std::memcmp(h + 257,
                    "ustar\0"
                    "00",
                    8) != 0) {
      return corrupt("header at offset " + std::to_string(off) +
                     " is not POSIX ustar (magic 'ustar\\0', version '00' expected)");
    }

    std::string name = FieldString(h, 100);
    const std::string prefix = FieldString(h + 345, 155);
    if (!prefix.empty()) name = prefix + "/" + name;
    const std::string shown = "'" + Printable(name) + "'";
    if (name.empty()) return corrupt("member at offset " + std::to_string(off) + " has no name");
    if (name[0] == '/') {
      return corrupt("member " + shown + " has an absolute path; cell members are relative");
    }
    if (HasDotDot(name)) {
      return corrupt("member " + shown + " has a '..' path component; cell members stay inside");
    }
    const unsigned char type = h[156];
    if (type != '0' && type != '\0') {
      return corrupt("member " + shown + " is " + TypeflagName(type) + " (typeflag '" +
                     Printable(std::string(1, static_cast<char>(type))) +
                     "'); a cell holds regular files only");
    }

    size_t index = kMembers.size();
    for (size_t i = 0; i < kMembers.size(); ++i) {
      if (name == kMembers[i].name) index = i;
    }
    if (index == kMembers.size()) {
      return corrupt("extra member " + shown +
                     "; a cell holds exactly metadata.json, cell.so and source/cell.cc");
    }
    if (seen[index]) return corrupt("duplicate member " + shown);
    seen[index] = true;

    uint64_t size = 0;
    if (!ParseOctal(h + 124, 12, &size)) {
      // Includes GNU base-256 sizes (high bit set), which only members over 8 GiB need.
      return corrupt("member " + shown + " has a size field that is not octal: '" +
                     Printable(FieldString(h + 124, 12)) + "'");
    }
    if (size > kMembers[index].max_bytes) {
      return corrupt("oversize member " + shown + ": header claims " + std::to_string(size) +
                     " bytes, limit " + std::to_string(kMembers[index].max_bytes));
    }
    const uint64_t body = off + kBlock;
    const uint64_t padded = size + Padding(size);  // size <= 1 GiB, no overflow
    if (total - body < padded) {
      return corrupt("truncated archive: member " + shown + " claims " + std::to_string(size) +
                     " bytes at offset " + std::to_string(body) + " but the archive has " +
                     std::to_string(total - body) + " left");
    }
    layout.*kMembers[index].span = MemberSpan{body, size};
    off = body + padded;
  }

  for (size_t i = 0; i < kMembers.size(); ++i) {
    if (!seen[i]) return corrupt("missing member '" + std::string(kMembers[i].name) + "'");
  }
  return layout;
}

ArchiveReader ReadFromBytes(std::string_view bytes) {
  return [bytes](uint64_t offset, char* out, size_t len) -> Result<size_t> {
    if (offset >= bytes.size()) return size_t{0};
    const size_t n = std::min<size_t>(len, bytes.size() - static_cast<size_t>(offset));
    std::memcpy(out, bytes.data() + offset, n);
    return n;
  };
}

Result<CellFiles> UnpackCell(std::string_view tar_bytes, const std::string& what) {
  KILN_ASSIGN_OR_RETURN(CellLayout layout,
                        IndexCell(ReadFromBytes(tar_bytes), tar_bytes.size(), what));
  CellFiles files;
  for (const MemberSpec& m : kMembers) {
    const MemberSpan& span = layout.*m.span;
    (files.*m.field).assign(tar_bytes.data() + span.offset, static_cast<size_t>(span.size));
  }
  return files;
}

std::string CellDigest(std::string_view tar_bytes) { return "sha256:" + Sha256Hex(tar_bytes); }

std::string CellRef(const std::string& key, const std::string& digest) {
  return key + "@" + digest;
}

}  // namespace kiln
