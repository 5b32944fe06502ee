// Dataset files: every format read into the same documents, file lists from directories and
// globs, token files written and read back, and one clear line for every bad input.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "test_dataset_util.h"
#include "titan/data/dataset.h"
#include "titan/data/dataset_read.h"
#include "titan/data/dataset_tokenize.h"
#include "titan/data/token_file.h"

namespace titan {
namespace {

using nlohmann::json;
using test::error_of;
using test::ScratchDir;
using test::write_text;

std::vector<std::string> texts_of(const DocumentFile& f) {
  std::vector<std::string> out;
  for (size_t i = 0; i < f.size(); ++i) out.push_back(f.record(i, DataMode::pretrain).text);
  return out;
}

const std::vector<std::string> kTexts = {"first document", "second one\nwith two lines",
                                         "third: ünïcödé, 你好 🙂"};

TEST(Dataset, JsonLinesArrayTextAndGzipGiveTheSameDocuments) {
  const ScratchDir dir("formats");
  std::string jsonl, text;
  json array = json::array();
  for (const std::string& t : kTexts) {
    jsonl += json{{"text", t}, {"url", "x"}}.dump() + "\n\n";  // blank lines are not records
    array.push_back({{"text", t}});
    text += t + "\n\n \n";
  }
  write_text(dir / "a.jsonl", jsonl);
  write_text(dir / "b.json", array.dump());
  write_text(dir / "c.txt", text);
  test::write_gzip(dir / "d.jsonl.gz", jsonl);
  test::write_gzip(dir / "e.txt.gz", text);
  // c4's layout: JSON Lines named .json.gz.
  test::write_gzip(dir / "c4-train.00000-of-01024.json.gz", jsonl);
  for (const char* name : {"a.jsonl", "b.json", "c.txt", "d.jsonl.gz", "e.txt.gz",
                           "c4-train.00000-of-01024.json.gz"}) {
    EXPECT_EQ(texts_of(DocumentFile::open(dir / name, {})), kTexts) << name;
  }
}

TEST(Dataset, TextFieldIsConfigurableAndIdsAreRead) {
  const ScratchDir dir("fields");
  write_text(dir / "a.jsonl", "{\"body\": \"hello\"}\n{\"ids\": [1, 2, 3]}\n");
  DatasetOptions o;
  o.text_field = "body";
  const DocumentFile f = DocumentFile::open(dir / "a.jsonl", o);
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f.record(0, DataMode::pretrain).text, "hello");
  const Record ids = f.record(1, DataMode::pretrain);
  EXPECT_EQ(ids.kind, Record::Kind::ids);
  EXPECT_EQ(ids.ids, (std::vector<int32_t>{1, 2, 3}));
}

TEST(Dataset, ChatRecordsHoldMessages) {
  const ScratchDir dir("chat");
  write_text(dir / "c.jsonl",
             json{{"messages",
                   {{{"role", "user"}, {"content", "hi"}},
                    {{"role", "assistant"}, {"content", "hello"}, {"reasoning_content", "r"}}}}}
                     .dump() +
                 "\n");
  const Record r = DocumentFile::open(dir / "c.jsonl", {}).record(0, DataMode::chat);
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[1].role, "assistant");
  EXPECT_EQ(r.messages[1].content, "hello");
  EXPECT_EQ(r.messages[1].reasoning_content, "r");
}

TEST(Dataset, DirectoriesAndGlobsAreSortedAndChecked) {
  const ScratchDir dir("paths");
  for (const char* name : {"b/2.txt", "a/1.txt", "a/0.txt", "c.txt", "a/.hidden", ".git/x"}) {
    write_text(dir / name, "x");
  }
  EXPECT_EQ(expand_data_paths({dir / "c.txt", dir / "a"}),
            (std::vector<std::string>{dir / "a/0.txt", dir / "a/1.txt", dir / "c.txt"}));
  EXPECT_EQ(
      expand_data_paths({dir.path().string()}),
      (std::vector<std::string>{dir / "a/0.txt", dir / "a/1.txt", dir / "b/2.txt", dir / "c.txt"}));
  EXPECT_EQ(expand_data_paths({dir / "*/[12].txt"}),
            (std::vector<std::string>{dir / "a/1.txt", dir / "b/2.txt"}));
  EXPECT_NE(error_of([&] {
              expand_data_paths({dir / "a", dir / "a/0.txt"});
            }).find("named more than once"),
            std::string::npos);
  EXPECT_NE(error_of([&] { expand_data_paths({dir / "*.jsonl"}); }).find("matches no files"),
            std::string::npos);
  EXPECT_NE(
      error_of([&] { expand_data_paths({dir / "missing.txt"}); }).find("missing.txt: no such file"),
      std::string::npos);
}

// A path that is no regular file or folder is named for what it is, never "no such file"; a
// folder holding a link back to itself is refused, not listed forever.
TEST(Dataset, SpecialFilesAndLinkLoopsAreNamed) {
  const ScratchDir dir("special");
  const auto error = [&](const std::string& path) {
    return error_of([&] { expand_data_paths({path}); });
  };
  ASSERT_EQ(::mkfifo((dir / "fifo").c_str(), 0600), 0);
  EXPECT_EQ(error(dir / "fifo"),
            dir / "fifo" +
                ": a FIFO (named pipe), not a regular file or folder (datasets "
                "are read from regular files)");
  EXPECT_EQ(error("/dev/null"),
            "/dev/null: a character device, not a regular file or folder (datasets are read from "
            "regular files)");
  EXPECT_EQ(error("/dev/zero"),
            "/dev/zero: a character device, not a regular file or folder (datasets are read from "
            "regular files)");
  std::filesystem::create_symlink(dir / "self", dir / "self");
  EXPECT_EQ(error(dir / "self"), dir / "self" + ": a symbolic link loop (it never reaches a file)");
  std::filesystem::create_symlink(dir / "gone.txt", dir / "dangling");
  EXPECT_EQ(error(dir / "dangling"), dir / "dangling" + ": a symbolic link to " + dir / "gone.txt" +
                                         ", which does not exist");
  EXPECT_EQ(error(dir / "missing.txt"), dir / "missing.txt" + ": no such file or directory");
  // Folders: one holding a link to itself, one holding a link to its parent, one holding a link
  // loop; a link to a folder elsewhere is followed.
  write_text(dir / "a/x.txt", "x");
  std::filesystem::create_directory_symlink(dir / "a", dir / "a/again");
  EXPECT_EQ(error(dir / "a"), dir / "a/again" + ": a symbolic link to " + dir / "a" +
                                  ", a folder that holds it (a loop); remove the link or name "
                                  "the files");
  write_text(dir / "b/c/y.txt", "y");
  std::filesystem::create_directory_symlink(dir / "b", dir / "b/c/up");
  EXPECT_EQ(error(dir / "b"), dir / "b/c/up" + ": a symbolic link to " + dir / "b" +
                                  ", a folder that holds it (a loop); remove the link or name "
                                  "the files");
  write_text(dir / "d/z.txt", "z");
  std::filesystem::create_symlink(dir / "d/loop", dir / "d/loop");
  EXPECT_EQ(error(dir / "d"), dir / "d/loop" + ": a symbolic link loop (it never reaches a file)");
  write_text(dir / "e/w.txt", "w");
  write_text(dir / "f/v.txt", "v");
  std::filesystem::create_directory_symlink(dir / "f", dir / "e/f");
  EXPECT_EQ(expand_data_paths({dir / "e"}),
            (std::vector<std::string>{dir / "e/f/v.txt", dir / "e/w.txt"}));
}

TEST(Dataset, GzipMembersConcatenate) {
  const ScratchDir dir("members");
  test::write_gzip(dir / "a.gz", "one\n\n");
  test::write_gzip(dir / "b.gz", "two\n");
  write_text(dir / "ab.txt.gz", test::read_bytes(dir / "a.gz") + test::read_bytes(dir / "b.gz"));
  EXPECT_EQ(texts_of(DocumentFile::open(dir / "ab.txt.gz", {})),
            (std::vector<std::string>{"one", "two"}));
}

TEST(Dataset, TokenFileRoundTripsThroughTokenize) {
  const ScratchDir dir("tokens");
  const Tokenizer& tok = test::trained_tokenizer();
  std::string jsonl;
  for (const std::string& t : kTexts) jsonl += json{{"text", t}}.dump() + "\n";
  write_text(dir / "in.jsonl", jsonl);
  DatasetOptions data;
  data.paths = {dir / "in.jsonl"};
  const TokenizeStats s = tokenize_to_token_file(tok, data, dir / "out.bin");
  EXPECT_EQ(s.n_docs, 3);
  EXPECT_FALSE(std::filesystem::exists(dir / "out.bin.tmp." + std::to_string(::getpid())));
  const DocumentFile f = DocumentFile::open(dir / "out.bin", {});
  EXPECT_EQ(f.vocab_size(), tok.vocab_size());
  ASSERT_EQ(f.size(), kTexts.size());
  int64_t n_tokens = 0;
  for (size_t i = 0; i < kTexts.size(); ++i) {
    const Record r = f.record(i, DataMode::pretrain);
    EXPECT_EQ(r.kind, Record::Kind::ids);
    EXPECT_EQ(r.ids, tok.encode(kTexts[i]));
    n_tokens += static_cast<int64_t>(r.ids.size());
  }
  EXPECT_EQ(s.n_tokens, n_tokens);
  EXPECT_EQ(std::filesystem::file_size(dir / "out.bin"),
            static_cast<uintmax_t>(32 + 4 * n_tokens + 8 * 3));
}

// ---- bad input: one line naming the file and the line or offset ----

TEST(DatasetBadInput, JsonLinesBadLineAndMissingField) {
  const ScratchDir dir("bad_jsonl");
  write_text(dir / "a.jsonl",
             "{\"text\": \"ok\"}\n\n{\"text\": \"unterminated}\n{\"txt\": \"x\"}\n");
  const DocumentFile f = DocumentFile::open(dir / "a.jsonl", {});
  ASSERT_EQ(f.size(), 3u);
  const std::string bad = error_of([&] { f.record(1, DataMode::pretrain); });
  EXPECT_EQ(bad.rfind(dir / "a.jsonl:3: the record is not valid JSON", 0), 0u) << bad;
  EXPECT_EQ(error_of([&] { f.record(2, DataMode::pretrain); }),
            dir / "a.jsonl:4: no \"text\" field (nor an \"ids\" list)");
  EXPECT_EQ(error_of([&] { f.record(0, DataMode::chat); }),
            dir / "a.jsonl:1: no non-empty \"messages\" list");
  EXPECT_THROW(f.record(1, DataMode::pretrain), BadRecordError);
}

// Plain text is read as UTF-8 as JSON is: an ill-formed byte makes its paragraph a bad record
// (skippable), named by file, line and column; it trained silently, repaired, before.
TEST(DatasetBadInput, InvalidUtf8InTextIsABadRecord) {
  const ScratchDir dir("bad_utf8");
  write_text(dir / "a.txt",
             "fine\n\nfirst line\nsecond \xff line\n\nok \xc3\xa9\n\n\xe6\x97 cut\n");
  const DocumentFile f = DocumentFile::open(dir / "a.txt", {});
  ASSERT_EQ(f.size(), 4u);
  EXPECT_EQ(f.record(0, DataMode::pretrain).text, "fine");
  EXPECT_EQ(error_of([&] { f.record(1, DataMode::pretrain); }),
            dir /
                "a.txt:4: not valid UTF-8 (byte 0xff at column 8): text files are read as "
                "UTF-8, as JSON is");
  EXPECT_THROW(f.record(1, DataMode::pretrain), BadRecordError);
  EXPECT_EQ(f.record(2, DataMode::pretrain).text, "ok \xc3\xa9");
  EXPECT_EQ(error_of([&] { f.record(3, DataMode::pretrain); }),
            dir /
                "a.txt:8: not valid UTF-8 (byte 0xe6 at column 1): text files are read as "
                "UTF-8, as JSON is");
  // The same bytes in JSON Lines are refused too.
  write_text(dir / "a.jsonl", "{\"text\": \"second \xff line\"}\n");
  EXPECT_THROW(DocumentFile::open(dir / "a.jsonl", {}).record(0, DataMode::pretrain),
               BadRecordError);
}

TEST(DatasetBadInput, BadIdsAndMessages) {
  const ScratchDir dir("bad_fields");
  write_text(dir / "a.jsonl",
             "{\"ids\": [1, -2]}\n{\"text\": 5}\n"
             "{\"messages\": [{\"role\": \"user\", \"content\": \"<|im_start|>assistant\"}]}\n"
             "{\"messages\": [{\"role\": \"robot\", \"content\": \"x\"}]}\n"
             "{\"messages\": [{\"role\": \"user\", \"content\": \"hi<|eot_id|>\"}]}\n");
  const DocumentFile f = DocumentFile::open(dir / "a.jsonl", {});
  EXPECT_EQ(error_of([&] { f.record(0, DataMode::pretrain); }),
            dir / "a.jsonl:1: \"ids\" holds -2, not a non-negative 32-bit integer");
  EXPECT_EQ(error_of([&] { f.record(1, DataMode::pretrain); }),
            dir / "a.jsonl:2: \"text\" is not a string");
  EXPECT_EQ(error_of([&] { f.record(2, DataMode::chat); }),
            dir / "a.jsonl:3: messages[0] contains <|im_start|>");
  EXPECT_EQ(error_of([&] { f.record(3, DataMode::chat); }),
            dir /
                "a.jsonl:4: messages[0] has role \"robot\" (expected system, user, assistant "
                "or tool)");
  // Llama 3's turn markers forge turns too.
  EXPECT_EQ(error_of([&] { f.record(4, DataMode::chat); }),
            dir / "a.jsonl:5: messages[0] contains <|eot_id|>");
}

TEST(DatasetBadInput, JsonArrayAndChatFromText) {
  const ScratchDir dir("bad_json");
  write_text(dir / "a.json", "[{\"text\": \"a\"}, {\"text\": ]");
  EXPECT_EQ(error_of([&] {
              DocumentFile::open(dir / "a.json", {});
            }).rfind(dir / "a.json: the JSON list is not valid JSON: ", 0),
            0u);
  write_text(dir / "c.txt", "plain");
  EXPECT_NE(error_of([&] {
              DocumentFile::open(dir / "c.txt", {}).record(0, DataMode::chat);
            }).find("c.txt: a plain text file has no chat messages"),
            std::string::npos);
}

TEST(DatasetBadInput, TruncatedAndCorruptGzip) {
  const ScratchDir dir("bad_gzip");
  std::string text;
  for (int i = 0; i < 2000; ++i) text += "line " + std::to_string(i * 7919 % 1000) + "\n";
  test::write_gzip(dir / "full.txt.gz", text);
  const std::string full = test::read_bytes(dir / "full.txt.gz");
  write_text(dir / "cut.txt.gz", full.substr(0, full.size() / 2));
  const std::string cut = error_of([&] { DocumentFile::open(dir / "cut.txt.gz", {}); });
  EXPECT_EQ(
      cut.rfind(dir / "cut.txt.gz: truncated gzip stream (the data ends at compressed offset " +
                    std::to_string(full.size() / 2),
                0),
      0u)
      << cut;
  // A damaged trailer: the CRC no longer matches.
  std::string damaged = full;
  damaged[damaged.size() - 6] ^= 0x55;
  write_text(dir / "crc.txt.gz", damaged);
  const std::string crc = error_of([&] { DocumentFile::open(dir / "crc.txt.gz", {}); });
  EXPECT_EQ(crc.rfind(dir / "crc.txt.gz: corrupt gzip data near compressed offset", 0), 0u) << crc;
  write_text(dir / "tail.txt.gz", full + "garbage");
  EXPECT_EQ(error_of([&] { DocumentFile::open(dir / "tail.txt.gz", {}); }),
            dir / "tail.txt.gz: bytes after the end of the gzip stream at compressed offset " +
                std::to_string(full.size()) + " are not gzip data");
}

// Inflated a piece at a time: exactly the limit is read, a byte more is refused by name before
// the rest of the stream is inflated; multi-member files count all members.
TEST(DatasetBadInput, GunzipStopsAtTheLimit) {
  const ScratchDir dir("gzip_limit");
  const std::string text(3'000'000, 'z');
  test::write_gzip(dir / "a.gz", text);
  const std::string gz = test::read_bytes(dir / "a.gz");
  EXPECT_EQ(gunzip(gz, "a.gz", text.size()), text);
  EXPECT_EQ(error_of([&] { gunzip(gz, "a.gz", text.size() - 1); }),
            "a.gz: decompresses to more than 2999999 bytes, the limit for one gzip file (set "
            "TITAN_GUNZIP_LIMIT, e.g. to 64GiB, to raise it, or split the file)");
  EXPECT_EQ(gunzip(gz + gz, "a.gz", 2 * text.size()), text + text);
  EXPECT_NE(error_of([&] { gunzip(gz + gz, "a.gz", 2 * text.size() - 1); }).find("more than"),
            std::string::npos);
}

TEST(DatasetBadInput, GunzipLimitComesFromTheEnvironment) {
  ASSERT_EQ(unsetenv("TITAN_GUNZIP_LIMIT"), 0);
  EXPECT_EQ(gunzip_limit(), uint64_t{4} << 30);
  ASSERT_EQ(setenv("TITAN_GUNZIP_LIMIT", "64GiB", 1), 0);
  EXPECT_EQ(gunzip_limit(), uint64_t{64} << 30);
  ASSERT_EQ(setenv("TITAN_GUNZIP_LIMIT", "lots", 1), 0);
  EXPECT_NE(error_of([] { gunzip_limit(); }).find("TITAN_GUNZIP_LIMIT \"lots\" is not a size"),
            std::string::npos);
  ASSERT_EQ(unsetenv("TITAN_GUNZIP_LIMIT"), 0);
}

// Hostile records: nesting past the limit is one bad record (skippable), and a bad element of
// "ids" is quoted by its start, not written out whole.
TEST(DatasetBadInput, DeepAndWideRecords) {
  const ScratchDir dir("deep_records");
  std::string wide = "{\"ids\": [1, [";
  for (int i = 0; i < 100'000; ++i) wide += i ? ",7" : "7";
  wide += "]]}\n";
  const std::string deep =
      "{\"ids\": [1, " + std::string(100'000, '[') + std::string(100'000, ']') + "]}\n";
  write_text(dir / "a.jsonl", deep + wide + "{\"text\": \"a\", \"text\": \"b\"}\n");
  const DocumentFile f = DocumentFile::open(dir / "a.jsonl", {});
  EXPECT_EQ(error_of([&] { f.record(0, DataMode::pretrain); }),
            dir / "a.jsonl:1: the record nests deeper than 128 levels");
  EXPECT_THROW(f.record(0, DataMode::pretrain), BadRecordError);
  EXPECT_EQ(error_of([&] { f.record(1, DataMode::pretrain); }),
            dir /
                "a.jsonl:2: \"ids\" holds array [7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7...,"
                " not a non-negative 32-bit integer");
  EXPECT_EQ(error_of([&] { f.record(2, DataMode::pretrain); }),
            dir / "a.jsonl:3: the record has the key \"text\" twice");
  write_text(dir / "b.json", "[" + deep.substr(0, deep.size() - 1) + "]");
  EXPECT_EQ(error_of([&] { DocumentFile::open(dir / "b.json", {}); }),
            dir / "b.json: the JSON list nests deeper than 129 levels");
}

// A token file by hand: header fields, tokens and document ends as given.
std::string token_file_bytes(uint32_t version, uint32_t vocab, const std::vector<uint32_t>& tokens,
                             const std::vector<uint64_t>& ends, int64_t extra_bytes = 0) {
  std::string b = "TITANTOK";
  const uint64_t n_tokens = tokens.size(), n_docs = ends.size();
  b.append(reinterpret_cast<const char*>(&version), 4);
  b.append(reinterpret_cast<const char*>(&vocab), 4);
  b.append(reinterpret_cast<const char*>(&n_tokens), 8);
  b.append(reinterpret_cast<const char*>(&n_docs), 8);
  b.append(reinterpret_cast<const char*>(tokens.data()), 4 * tokens.size());
  b.append(reinterpret_cast<const char*>(ends.data()), 8 * ends.size());
  if (extra_bytes > 0) b.append(static_cast<size_t>(extra_bytes), '\0');
  if (extra_bytes < 0) b.erase(b.size() - static_cast<size_t>(-extra_bytes));
  return b;
}

TEST(DatasetBadInput, TokenFileHeaderAndIds) {
  const ScratchDir dir("bad_tokens");
  const auto open_error = [&](const std::string& name, const std::string& bytes) {
    write_text(dir / name, bytes);
    return error_of([&] { DocumentFile::open(dir / name, {}); });
  };
  EXPECT_EQ(open_error("v.bin", token_file_bytes(2, 10, {1, 2}, {2})),
            dir / "v.bin: token file version 2 at offset 8 is not supported (only 1)");
  EXPECT_EQ(open_error("z.bin", token_file_bytes(1, 0, {1, 2}, {2})),
            dir / "z.bin: vocab_size 0 at offset 12 is out of range");
  EXPECT_EQ(open_error("cut.bin", token_file_bytes(1, 10, {1, 2}, {2}, -3)),
            dir /
                "cut.bin: header says 2 tokens and 1 documents (offsets 16, 24), which needs 32 "
                "+ 4 * n_tokens + 8 * n_docs bytes, but the file has 45");
  EXPECT_EQ(open_error("short.bin", "TITANTOK\x01"),
            dir / "short.bin: not a token file (no \"TITANTOK\" header at offset 0)");
  EXPECT_EQ(open_error("table.bin", token_file_bytes(1, 10, {1, 2, 3}, {2, 1})),
            dir / "table.bin: document table entry 1 at offset 52 is 1, outside [2, 3]");
  EXPECT_EQ(open_error("end.bin", token_file_bytes(1, 10, {1, 2, 3}, {2})),
            dir / "end.bin: the document table ends at token 2 but the file holds 3 tokens");
  write_text(dir / "ids.bin", token_file_bytes(1, 10, {1, 2, 3, 10, 4}, {2, 5}));
  const DocumentFile f = DocumentFile::open(dir / "ids.bin", {});
  EXPECT_EQ(f.record(0, DataMode::pretrain).ids, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(error_of([&] { f.record(1, DataMode::pretrain); }),
            dir / "ids.bin: token id 10 at offset 44 is outside the vocabulary [0, 10)");
  test::write_gzip(dir / "gz.bin", token_file_bytes(1, 10, {1}, {1}));
  EXPECT_EQ(error_of([&] { DocumentFile::open(dir / "gz.bin", {}); }),
            dir /
                "gz.bin: a gzip-compressed token file (token files are mapped in place; gunzip "
                "it)");
}

TEST(DatasetBadInput, TokenizeStopsOrSkipsAndCounts) {
  const ScratchDir dir("bad_tokenize");
  const Tokenizer& tok = test::trained_tokenizer();
  write_text(dir / "in.jsonl", "{\"text\": \"a\"}\n{\"ids\": [99999]}\n{\"text\": \"b\"}\nnope\n");
  DatasetOptions data;
  data.paths = {dir / "in.jsonl"};
  EXPECT_EQ(error_of([&] { tokenize_to_token_file(tok, data, dir / "out.bin"); }),
            dir / "in.jsonl:2: id 99999 is outside the vocabulary [0, 2048)");
  EXPECT_FALSE(std::filesystem::exists(dir / "out.bin"));
  data.skip_bad_records = true;
  const TokenizeStats s = tokenize_to_token_file(tok, data, dir / "out.bin");
  EXPECT_EQ(s.n_docs, 2);
  EXPECT_EQ(s.n_skipped, 2);
  EXPECT_EQ(s.first_skipped, dir / "in.jsonl:2: id 99999 is outside the vocabulary [0, 2048)");
}

}  // namespace
}  // namespace titan
