// Single-thread encode throughput of titan's tokenizer against Hugging Face tokenizers on the same
// multilingual corpus in the same run (bar: titan >= 1.5x), after checking both give the same ids;
// then titan's throughput with all threads over the documents. Timed passes run with warm word
// caches on both sides (best of REPEATS); the first, cold pass is printed as well.
//
// usage: bench_tokenizer [TOKENIZER_DIR] [REPEATS]
//   TOKENIZER_DIR defaults to $TITAN_QWEN3_TOKENIZER, else the repository's copy,
//   tests/fixtures/qwen3-tokenizer; Python is $TITAN_PYTHON, else the source tree's .venv.
//
// Corpus: English licence texts from /usr/share/common-licenses (one document per paragraph),
// titan's own C++ sources (code), and documents of shuffled sentences in 14 other languages and
// emoji, each group about a third of the bytes.
#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench_main.h"
#include "titan/backend/cpu/threads.h"
#include "titan/core/error.h"
#include "titan/data/tokenizer.h"

namespace fs = std::filesystem;

namespace {

using titan::bench::now_seconds;

const std::vector<std::vector<std::string>> kSentences = {
    {"今天的天气非常好，我们决定去公园散步。", "机器学习模型需要大量的数据进行训练。",
     "这本书讲述了一个关于友谊和勇气的故事。", "城市的交通在早上八点左右最为拥堵。",
     "他每天早上都会喝一杯咖啡，然后开始工作。", "研究人员发现了一种新的方法来提高效率。"},
    {"今日はとても良い天気ですね。", "東京駅から新幹線に乗って大阪へ行きました。",
     "このプログラムはコンピュータの性能を測定します。", "私たちは毎週土曜日にサッカーをします。",
     "ラーメンとお寿司のどちらが好きですか？", "新しいスマートフォンを買ったばかりです。"},
    {"오늘 날씨가 정말 좋네요.", "서울은 대한민국의 수도이며 인구가 많은 도시입니다.",
     "저는 매일 아침 여섯 시에 일어나서 운동을 합니다.", "이 식당의 김치찌개는 아주 맛있어요.",
     "인공지능 기술은 빠르게 발전하고 있습니다.", "주말에 가족과 함께 영화를 보러 갔어요."},
    {"مرحبا بكم في هذا الموقع الجديد.", "تعتبر اللغة العربية من أكثر اللغات انتشارا في العالم.",
     "ذهبت إلى السوق لشراء الخضروات والفواكه.", "يدرس الطلاب في الجامعة علوم الحاسوب.",
     "كان الجو حارا جدا في فصل الصيف.", "قرأت كتابا مثيرا عن تاريخ الأندلس."},
    {"Москва является столицей Российской Федерации.", "Я люблю читать книги по вечерам.",
     "Погода сегодня холодная, но солнечная.", "Студенты готовятся к экзаменам в конце семестра.",
     "Этот алгоритм работает быстрее предыдущей версии.", "Мы поехали на дачу на выходные."},
    {"भारत एक विशाल और विविधतापूर्ण देश है।", "मुझे सुबह चाय पीना बहुत पसंद है।", "बच्चे पार्क में खेल रहे हैं।",
     "यह किताब हिंदी साहित्य का एक महत्वपूर्ण हिस्सा है।", "कल बारिश होने की संभावना है।",
     "हमने नई तकनीक के बारे में सीखा।"},
    {"Η Αθήνα είναι η πρωτεύουσα της Ελλάδας.", "Μου αρέσει να διαβάζω βιβλία ιστορίας.",
     "Ο καιρός σήμερα είναι υπέροχος.", "Οι μαθητές πηγαίνουν στο σχολείο κάθε πρωί."},
    {"ประเทศไทยมีอาหารที่อร่อยมากมาย", "ฉันชอบไปเที่ยวทะเลในช่วงฤดูร้อน",
     "กรุงเทพมหานครเป็นเมืองหลวงของประเทศไทย", "วันนี้อากาศร้อนมาก"},
    {"Hôm nay trời rất đẹp và chúng tôi đi dạo.", "Tiếng Việt có sáu thanh điệu khác nhau.",
     "Tôi thích ăn phở vào buổi sáng.", "Hà Nội là thủ đô của Việt Nam."},
    {"Die Universität wurde im Jahr 1386 gegründet.", "Ich möchte gerne einen Kaffee bestellen.",
     "Übermorgen fahren wir mit dem Zug nach München.", "Größere Modelle benötigen mehr Speicher."},
    {"L'été dernier, nous sommes allés à la plage.", "Ça coûte combien, s'il vous plaît ?",
     "Les élèves étudient la littérature française.", "Il faut être patient et persévérant."},
    {"¿Dónde está la estación de tren más cercana?", "El niño comió una manzana y una naranja.",
     "Mañana vamos a celebrar el cumpleaños de mi abuela.",
     "La música latinoamericana es muy rica."},
    {"İstanbul, Türkiye'nin en kalabalık şehridir.", "Bugün hava çok güzel, dışarı çıkalım.",
     "Öğrenciler sınavlara hazırlanıyor."},
    {"שלום, מה שלומך היום?", "ירושלים היא עיר עתיקה וחשובה.", "אני אוהב ללמוד שפות חדשות."},
    {"Great job! 🎉🎉 See you soon 😀👍🏽",
     "Family: 👨‍👩‍👧‍👦 and flags 🇯🇵 🇩🇪 🏳️‍🌈",
     "Weather ☀️ → 🌧️ → ⛈️, temperature 23.5°C",
     "Price: $1,299.99 (−15%) — limited offer!"},
};

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Corpus {
  std::vector<std::string> docs;
  size_t english = 0, code = 0, multilingual = 0;
  size_t bytes() const { return english + code + multilingual; }
};

Corpus build_corpus(const fs::path& source_dir) {
  Corpus c;
  for (const auto& entry : fs::directory_iterator("/usr/share/common-licenses")) {
    if (!entry.is_regular_file()) continue;
    std::istringstream in(read_file(entry.path()));
    std::string line, paragraph;
    while (std::getline(in, line)) {
      paragraph += line + "\n";
      if (line.find_first_not_of(" \t") == std::string::npos && paragraph.size() > 1) {
        c.english += paragraph.size();
        c.docs.push_back(std::move(paragraph));
        paragraph.clear();
      }
    }
  }
  for (const auto& entry : fs::recursive_directory_iterator(source_dir / "src")) {
    if (c.code >= c.english) break;
    const auto ext = entry.path().extension();
    if (!entry.is_regular_file() || (ext != ".cpp" && ext != ".h")) continue;
    c.docs.push_back(read_file(entry.path()));
    c.code += c.docs.back().size();
  }
  std::mt19937 rng(2024);
  while (c.multilingual < c.english) {
    const auto& pool = kSentences[rng() % kSentences.size()];
    std::string doc;
    const int n = 3 + static_cast<int>(rng() % 10);
    for (int i = 0; i < n; ++i) doc += pool[rng() % pool.size()] + (rng() % 4 ? " " : "\n\n");
    c.multilingual += doc.size();
    c.docs.push_back(std::move(doc));
  }
  std::shuffle(c.docs.begin(), c.docs.end(), rng);
  return c;
}

// FNV-1a over the ids with a separator per document; tokenizer_bench.py computes the same.
uint64_t ids_checksum(const std::vector<std::vector<int32_t>>& all_ids) {
  uint64_t h = 1469598103934665603ull;
  for (const auto& ids : all_ids) {
    for (int32_t id : ids) h = (h ^ static_cast<uint64_t>(id)) * 1099511628211ull;
    h = (h ^ 0xFFFFFFFFull) * 1099511628211ull;
  }
  return h;
}

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

int run(int argc, char** argv) {
  const fs::path source_dir = TITAN_SOURCE_DIR;
  const std::string tokenizer_dir =
      argc > 1 ? argv[1]
               : env_or("TITAN_QWEN3_TOKENIZER",
                        (source_dir / "tests/fixtures/qwen3-tokenizer").string());
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 3;
  TITAN_CHECK(repeats >= 1, "REPEATS must be at least 1");
  const std::string python = env_or("TITAN_PYTHON", (source_dir / ".venv/bin/python").string());

  const Corpus corpus = build_corpus(source_dir);
  std::printf("corpus: %zu documents, %.2f MB (English %.2f, code %.2f, multilingual %.2f)\n",
              corpus.docs.size(), corpus.bytes() / 1e6, corpus.english / 1e6, corpus.code / 1e6,
              corpus.multilingual / 1e6);

  const fs::path tmp =
      fs::temp_directory_path() / ("titan_bench_tokenizer_" + std::to_string(getpid()));
  fs::create_directories(tmp);
  {
    std::ofstream docs(tmp / "docs.jsonl");
    for (const std::string& d : corpus.docs) docs << nlohmann::json{{"text", d}}.dump() << '\n';
  }
  const std::string cmd = "'" + python + "' '" +
                          (source_dir / "tests/reference/tokenizer_bench.py").string() + "' '" +
                          tokenizer_dir + "/tokenizer.json' '" + (tmp / "docs.jsonl").string() +
                          "' " + std::to_string(repeats) + " '" + (tmp / "hf.json").string() + "'";
  const int rc = std::system(cmd.c_str());
  const std::string hf_result = rc == 0 ? read_file(tmp / "hf.json") : "";
  fs::remove_all(tmp);
  TITAN_CHECK(rc == 0, "the Hugging Face reference failed: ", cmd);
  const nlohmann::json hf = nlohmann::json::parse(hf_result);

  const titan::Tokenizer tok = titan::Tokenizer::load(tokenizer_dir);
  std::vector<std::vector<int32_t>> all_ids;
  size_t tokens = 0;
  const double first_start = now_seconds();
  for (const std::string& d : corpus.docs) all_ids.push_back(tok.encode(d));
  const double first = now_seconds() - first_start;
  for (const auto& ids : all_ids) tokens += ids.size();
  TITAN_CHECK(std::to_string(ids_checksum(all_ids)) == hf["checksum"].get<std::string>() &&
                  tokens == hf["tokens"].get<size_t>(),
              "titan and Hugging Face give different ids on the corpus; not timing");
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const double start = now_seconds();
    for (const std::string& d : corpus.docs) tok.encode(d);
    best = std::min(best, now_seconds() - start);
  }
  const double hf_seconds = hf["best_seconds"].get<double>();
  const double mb = corpus.bytes() / 1e6;
  std::printf("ids identical: %zu tokens\n", tokens);
  std::printf("hf tokenizers, 1 thread : %7.2f MB/s  %10.0f tokens/s\n", mb / hf_seconds,
              tokens / hf_seconds);
  std::printf("titan,         1 thread : %7.2f MB/s  %10.0f tokens/s\n", mb / best, tokens / best);
  std::printf("ratio titan / hf (1 thread): %.2fx (bar >= 1.5x)\n", hf_seconds / best);
  std::printf("first pass, cold word caches: hf %.2f MB/s, titan %.2f MB/s, ratio %.2fx\n",
              mb / hf["first_seconds"].get<double>(), mb / first,
              hf["first_seconds"].get<double>() / first);

  const int threads = titan::default_thread_count();
  double best_parallel = 1e30;
  const auto n = static_cast<int64_t>(corpus.docs.size());
  for (int r = 0; r < repeats; ++r) {
    const double start = now_seconds();
#pragma omp parallel for schedule(dynamic, 8) num_threads(threads)
    for (int64_t i = 0; i < n; ++i) tok.encode(corpus.docs[i]);
    best_parallel = std::min(best_parallel, now_seconds() - start);
  }
  std::printf("titan, %2d threads       : %7.2f MB/s  %10.0f tokens/s (%.2fx one thread)\n",
              threads, mb / best_parallel, tokens / best_parallel, best / best_parallel);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return titan::bench::run_main("bench_tokenizer", run, argc, argv);
}
