// Finding a folder's chat template as transformers' AutoTokenizer does, and recognising it among
// the official templates titan renders. Recognition is by the template's exact text, after the two
// normalisations Jinja itself applies to a template source (line endings to "\n", one trailing
// newline dropped), so it never guesses: a template edited in any way renders differently in
// Hugging Face and is refused here. The texts themselves are in tests/fixtures/chat_templates.json
// (with their sources); here only their FNV-1a hashes and lengths.
#include <array>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "titan/core/error.h"
#include "titan/core/rng.h"
#include "titan/data/chat_template.h"
#include "titan/io/json_util.h"

namespace titan {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct KnownTemplate {
  uint64_t fnv1a;
  size_t length;
  ChatTemplateKind kind;
};

constexpr std::array<KnownTemplate, 6> kKnownTemplates = {{
    {0x2bfdb7aa9754484eull, 4116, ChatTemplateKind::qwen3},     // Qwen3 (first revision)
    {0x959a4551391a6549ull, 4168, ChatTemplateKind::qwen3},     // Qwen3 (later revision)
    {0xe642ce246d7f2e3dull, 2506, ChatTemplateKind::qwen2_5},   // Qwen2.5 Instruct
    {0x0e60067a5537498eull, 389, ChatTemplateKind::llama3},     // Meta-Llama-3 Instruct
    {0xcc0368e1ffb6b958ull, 4613, ChatTemplateKind::llama3_1},  // Llama 3.1 Instruct
    {0x368f4c34b8554414ull, 3826, ChatTemplateKind::llama3_2},  // Llama 3.2 Instruct
}};

constexpr size_t kMaxTemplateBytes = size_t{1} << 20;

// Jinja's lexer: every line ending becomes "\n" and one trailing newline is dropped
// (keep_trailing_newline=False, as transformers compiles chat templates).
std::string jinja_source(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\r') {
      out += '\n';
      if (i + 1 < text.size() && text[i + 1] == '\n') ++i;
    } else {
      out += text[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

std::string read_template_file(const fs::path& path) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  TITAN_CHECK(!ec && size <= kMaxTemplateBytes, path.string(),
              ec ? ": cannot be read" : ": larger than any chat template titan renders");
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  TITAN_CHECK(in.good() || in.eof(), path.string(), ": cannot be read");
  return text;
}

// tokenizer_config.json's "chat_template": a string, or a list of {"name", "template"} whose
// "default" entry is the one used without tools. Empty when absent.
std::string config_template(const json& config, const std::string& file) {
  if (!config.contains("chat_template") || config["chat_template"].is_null()) return "";
  const json& t = config["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  TITAN_CHECK(t.is_array(), file, ": \"chat_template\" must be a string or a list of templates");
  for (const json& entry : t) {
    TITAN_CHECK(entry.is_object() && entry.contains("name") && entry["name"].is_string() &&
                    entry.contains("template") && entry["template"].is_string(),
                file, ": each \"chat_template\" entry needs a string \"name\" and \"template\"");
    if (entry["name"] == "default") return entry["template"].get<std::string>();
  }
  fail(file, ": \"chat_template\" lists templates but none named \"default\"");
}

// Named templates beside the default one: any *.jinja there (Transformers then ignores
// tokenizer_config.json's entry).
bool has_additional_templates(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return false;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.path().extension() == ".jinja") return true;
  }
  return false;
}

std::string config_bos_token(const json& config, const std::string& file) {
  if (!config.contains("bos_token") || config["bos_token"].is_null()) return "";
  const json& v = config["bos_token"];
  if (v.is_string()) return v.get<std::string>();
  TITAN_CHECK(v.is_object() && v.contains("content") && v["content"].is_string(), file,
              ": \"bos_token\" must be a string or {\"content\": ...}");
  return v["content"].get<std::string>();
}

}  // namespace

ChatTemplate ChatTemplate::load(const std::string& dir_or_json_path) {
  std::error_code ec;
  const fs::path dir = fs::is_directory(dir_or_json_path, ec)
                           ? fs::path(dir_or_json_path)
                           : fs::path(dir_or_json_path).parent_path();
  const fs::path config_path = dir / "tokenizer_config.json";
  const fs::path jinja_path = dir / "chat_template.jinja";
  json config = json::object();
  if (fs::is_regular_file(config_path, ec)) {
    config = read_json_file(config_path.string(), "tokenizer_config.json", kMaxJsonDocumentDepth);
    TITAN_CHECK(config.is_object(), config_path.string(), ": not a JSON object");
  }
  std::string text, file;
  if (fs::is_regular_file(jinja_path, ec)) {
    file = jinja_path.string();
    text = read_template_file(jinja_path);
  } else {
    TITAN_CHECK(!has_additional_templates(dir / "additional_chat_templates"), dir.string(),
                ": additional_chat_templates/ without chat_template.jinja leaves no default chat "
                "template");
    file = config_path.string();
    text = config_template(config, file);
    TITAN_CHECK(!text.empty(), dir.string(),
                ": no chat template (no chat_template.jinja, no \"chat_template\" in "
                "tokenizer_config.json)");
  }
  const std::string source = jinja_source(text);
  const uint64_t hash = fnv1a_hash(source);
  for (const KnownTemplate& known : kKnownTemplates) {
    if (known.fnv1a == hash && known.length == source.size()) {
      return ChatTemplate(known.kind, config_bos_token(config, config_path.string()));
    }
  }
  fail(file,
       ": not a chat template titan renders (it renders the official Qwen3, Qwen2.5 Instruct, "
       "Llama 3, 3.1 and 3.2 Instruct templates, unmodified); raw prompts (titan generate "
       "--prompt without --chat) still work");
}

}  // namespace titan
