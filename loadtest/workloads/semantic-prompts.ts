/**
 * A labelled set of prompts for semantic model selection (the `semantic` bench and its tests),
 * written for this project: five domains and general chat, phrased the way users ask, some with
 * the domain's obvious words and some without. Plus short texts in eight languages for the
 * language detector. Every label is the domain a careful human router would pick.
 */

export const SEMANTIC_DOMAINS = ["code", "math", "medical", "legal", "creative", "general"] as const;
export type SemanticDomain = (typeof SEMANTIC_DOMAINS)[number];

export interface LabelledPrompt {
  text: string;
  domain: SemanticDomain;
}

const code = [
  "Write a Python function that removes duplicates from a list while keeping the order.",
  "Why does my JavaScript promise never resolve when I forget to return it inside then?",
  "Refactor this class so the database connection is injected instead of created in the constructor.",
  "How do I fix a segmentation fault when I free a pointer twice in C?",
  "Explain the difference between a mutex and a semaphore with an example in Go.",
  "My Rust program fails to compile with a borrow checker error about a mutable reference in a loop.",
  "Write a SQL query that returns the top three customers by total order value per month.",
  "What is the time complexity of inserting into a binary heap, and how would I implement one?",
  "The stack trace says NullPointerException at line 42 of my Java service; where should I start?",
  "Convert this bash script into a Makefile target that runs the tests in parallel.",
  "How can I debounce an input handler in React without re-creating the function on every render?",
  "Write unit tests for a function that parses ISO dates and rejects invalid ones.",
  "Set up a GitHub Actions workflow that builds a Docker image and pushes it on every tag.",
  "What does this regular expression match: ^[a-z0-9_-]{3,16}$ ?",
  "Implement a least recently used cache in TypeScript with get and put in constant time.",
  "My Kubernetes pod keeps restarting with OOMKilled; how do I find which container uses the memory?",
];

const math = [
  "What is the integral of x squared times e to the x?",
  "Prove that the square root of two is irrational.",
  "Solve the equation 3x + 7 = 22 and show each step.",
  "Find the derivative of sin(x) divided by x.",
  "How many ways can five people sit around a round table?",
  "What is the probability of rolling two sixes with two fair dice?",
  "Compute the eigenvalues of the matrix with rows 2 1 and 1 2.",
  "Explain why the sum of the angles of a triangle is 180 degrees.",
  "Is 221 a prime number? Show how you check it.",
  "What is the limit of (1 + 1/n) to the power n as n goes to infinity?",
  "Find the area under the curve y = 1/x between 1 and e.",
  "A train leaves at 60 km/h and another at 80 km/h an hour later; when does the second catch up?",
  "Show that the set of rational numbers is countable.",
  "What is the standard deviation of the numbers 2, 4, 4, 4, 5, 5, 7, 9?",
  "Simplify the expression (x^2 - 9) / (x - 3).",
  "Give the Taylor series of cos(x) around zero up to the fourth term.",
];

const medical = [
  "What are the common side effects of ibuprofen, and who should avoid it?",
  "I have had a headache and a fever for three days; when should I see a doctor?",
  "Explain the difference between type 1 and type 2 diabetes.",
  "What blood pressure reading counts as hypertension for an adult?",
  "Can I take paracetamol together with an antibiotic like amoxicillin?",
  "What are the early symptoms of a stroke that family members should watch for?",
  "How long is someone with the flu contagious after the symptoms start?",
  "What does a high cholesterol result mean and how is it usually treated?",
  "My child has a rash with small red spots and a mild fever; what could it be?",
  "What vaccines are recommended for adults over sixty-five?",
  "How much sleep does a teenager need, and what happens with chronic lack of sleep?",
  "What is the recommended dose of vitamin D for someone with a deficiency?",
  "What are the warning signs of a heart attack in women?",
  "How is asthma diagnosed and what inhalers are commonly prescribed?",
  "Is it safe to exercise during pregnancy, and which activities should be avoided?",
  "What causes lower back pain after sitting all day, and which stretches help?",
];

const legal = [
  "Can my landlord keep my security deposit for normal wear and tear?",
  "What should a non-disclosure agreement include to be enforceable?",
  "How do I contest a parking ticket I believe was issued unfairly?",
  "What is the difference between a will and a living trust?",
  "My employer has not paid my overtime for two months; what are my rights?",
  "Do I need a lawyer to register a trademark for my small business name?",
  "What happens if I break a lease agreement six months early?",
  "Explain what liability means in a contract between two companies.",
  "Is a verbal agreement legally binding if there were witnesses?",
  "How does copyright apply to photos I post on social media?",
  "What are the steps to file for divorce when both spouses agree?",
  "Can a company use my personal data without consent under the GDPR?",
  "What is the statute of limitations for a breach of contract claim?",
  "How do I write a cease and desist letter to a competitor copying my product?",
  "Who is responsible when a delivery driver is injured on my property?",
  "What clauses should I check before signing an employment contract with a non-compete?",
];

const creative = [
  "Write a short poem about the sea at night.",
  "Tell me a bedtime story about a dragon who is afraid of the dark.",
  "Write the opening paragraph of a mystery novel set in a lighthouse.",
  "Give me five names for a fantasy kingdom built inside a mountain.",
  "Write a haiku about autumn leaves falling in the rain.",
  "Describe a futuristic city from the point of view of a street cat.",
  "Write song lyrics about leaving home for the first time.",
  "Invent a dialogue between a robot and a gardener about flowers.",
  "Write a limerick about a programmer who hates Mondays.",
  "Create a character sketch of a retired pirate who runs a bakery.",
  "Write a short story that ends with the words 'and the door was never opened again'.",
  "Describe a sunset over the desert in the style of a nineteenth-century novel.",
  "Write a funny toast for my best friend's wedding.",
  "Imagine a world where it rains upward; write a scene set there.",
  "Write a sonnet about a lost letter finally delivered.",
  "Give me a plot twist for a science fiction story about time travel.",
];

const general = [
  "What is the capital of Australia?",
  "Recommend a few good books for a long train journey.",
  "How do I get red wine out of a white shirt?",
  "What is a good way to plan a week of vegetarian dinners?",
  "Translate 'good morning' into Japanese.",
  "What should I pack for a weekend hiking trip in the mountains?",
  "Summarize the main causes of the French Revolution.",
  "How do I politely decline an invitation to a party?",
  "Which houseplants are easy to keep alive in a dark apartment?",
  "What are some tips for a first job interview?",
  "How does a heat pump heat a house in winter?",
  "Suggest a name for a golden retriever puppy.",
  "What time zone is New Zealand in?",
  "How can I save money on groceries each month?",
  "Explain how tides work in simple terms.",
  "What is the difference between weather and climate?",
];

export const LABELLED_PROMPTS: readonly LabelledPrompt[] = [
  ...code.map((text) => ({ text, domain: "code" as const })),
  ...math.map((text) => ({ text, domain: "math" as const })),
  ...medical.map((text) => ({ text, domain: "medical" as const })),
  ...legal.map((text) => ({ text, domain: "legal" as const })),
  ...creative.map((text) => ({ text, domain: "creative" as const })),
  ...general.map((text) => ({ text, domain: "general" as const })),
];

/** Keywords per domain, as an operator would first write them. */
export const DOMAIN_KEYWORDS: Readonly<Record<Exclude<SemanticDomain, "general">, readonly string[]>> = {
  code: ["python", "javascript", "typescript", "rust", "java", "sql", "function", "compile", "stack trace", "bug", "refactor", "docker", "kubernetes", "regex", "regular expression", "unit tests", "react", "class"],
  math: ["integral", "derivative", "equation", "prove", "probability", "matrix", "eigenvalues", "prime", "limit", "series", "simplify", "standard deviation", "countable"],
  medical: ["symptoms", "doctor", "dose", "side effects", "fever", "diabetes", "blood pressure", "vaccines", "asthma", "pregnancy", "heart attack", "cholesterol"],
  legal: ["lawyer", "contract", "lease", "landlord", "trademark", "copyright", "liability", "divorce", "gdpr", "rights", "legally", "clause", "clauses", "agreement"],
  creative: ["poem", "story", "haiku", "lyrics", "sonnet", "limerick", "novel", "character", "scene", "plot", "toast", "describe"],
};

/** Example utterances per domain for similarity signals (not in the labelled set). */
export const DOMAIN_EXAMPLES: Readonly<Record<Exclude<SemanticDomain, "general">, readonly string[]>> = {
  code: [
    "write a function in python or javascript",
    "my program fails to compile with an error",
    "fix the bug in this code and explain the stack trace",
    "write a sql query or a regular expression",
    "implement a data structure class with tests",
    "set up docker kubernetes and a build workflow",
  ],
  math: [
    "solve the equation and show the steps",
    "compute the integral or the derivative of the function",
    "prove the theorem about numbers",
    "what is the probability and the standard deviation",
    "find the limit of the series or sequence",
    "compute the eigenvalues of the matrix",
  ],
  medical: [
    "what are the symptoms and when should I see a doctor",
    "side effects and dose of a medicine",
    "how is the disease diagnosed and treated",
    "is it safe during pregnancy for my health",
    "warning signs of a heart attack or stroke",
    "fever rash and pain in a child",
  ],
  legal: [
    "what are my rights under the law",
    "is the contract agreement legally binding",
    "my landlord and the lease deposit",
    "copyright trademark and intellectual property",
    "do I need a lawyer to file a claim",
    "employment contract clauses and liability",
  ],
  creative: [
    "write a poem about",
    "tell me a short story about a character",
    "write song lyrics or a haiku",
    "describe a scene in the style of a novel",
    "invent names for a fantasy world",
    "write a funny toast or a limerick",
  ],
};

/** Short texts with their ISO 639-1 language, for the language detector's accuracy. */
export const LABELLED_LANGUAGES: ReadonlyArray<{ text: string; lang: string }> = [
  { lang: "en", text: "Could you help me write a cover letter for a nursing job?" },
  { lang: "en", text: "The train was late again this morning, so I missed the meeting." },
  { lang: "en", text: "Explain how photosynthesis works to a ten year old." },
  { lang: "en", text: "What are the best places to visit in Scotland during the summer?" },
  { lang: "en", text: "Please summarise this article in three sentences." },
  { lang: "fr", text: "Pouvez-vous m'aider à écrire une lettre de motivation pour un poste d'infirmière ?" },
  { lang: "fr", text: "Le train était encore en retard ce matin, alors j'ai raté la réunion." },
  { lang: "fr", text: "Explique comment fonctionne la photosynthèse à un enfant de dix ans." },
  { lang: "fr", text: "Quels sont les meilleurs endroits à visiter en Bretagne en été ?" },
  { lang: "fr", text: "Résume cet article en trois phrases, s'il te plaît." },
  { lang: "de", text: "Kannst du mir helfen, ein Bewerbungsschreiben für eine Stelle als Pflegekraft zu schreiben?" },
  { lang: "de", text: "Der Zug hatte heute Morgen wieder Verspätung, deshalb habe ich die Besprechung verpasst." },
  { lang: "de", text: "Erkläre einem zehnjährigen Kind, wie die Photosynthese funktioniert." },
  { lang: "de", text: "Welche Orte sollte man im Sommer in Bayern unbedingt besuchen?" },
  { lang: "de", text: "Bitte fasse diesen Artikel in drei Sätzen zusammen." },
  { lang: "es", text: "¿Puedes ayudarme a escribir una carta de presentación para un trabajo de enfermera?" },
  { lang: "es", text: "El tren volvió a llegar tarde esta mañana, así que me perdí la reunión." },
  { lang: "es", text: "Explica cómo funciona la fotosíntesis a un niño de diez años." },
  { lang: "es", text: "¿Cuáles son los mejores lugares para visitar en Andalucía en verano?" },
  { lang: "es", text: "Por favor, resume este artículo en tres frases." },
  { lang: "it", text: "Puoi aiutarmi a scrivere una lettera di presentazione per un lavoro da infermiera?" },
  { lang: "it", text: "Il treno era di nuovo in ritardo stamattina, quindi ho perso la riunione." },
  { lang: "it", text: "Spiega come funziona la fotosintesi a un bambino di dieci anni." },
  { lang: "it", text: "Quali sono i posti migliori da visitare in Toscana d'estate?" },
  { lang: "it", text: "Per favore, riassumi questo articolo in tre frasi." },
  { lang: "pt", text: "Você pode me ajudar a escrever uma carta de apresentação para uma vaga de enfermeira?" },
  { lang: "pt", text: "O comboio voltou a atrasar esta manhã, por isso perdi a reunião." },
  { lang: "pt", text: "Explique como funciona a fotossíntese para uma criança de dez anos." },
  { lang: "pt", text: "Quais são os melhores lugares para visitar no Algarve no verão?" },
  { lang: "pt", text: "Por favor, resuma este artigo em três frases." },
  { lang: "nl", text: "Kun je me helpen een sollicitatiebrief te schrijven voor een baan als verpleegkundige?" },
  { lang: "nl", text: "De trein had vanochtend weer vertraging, dus ik heb de vergadering gemist." },
  { lang: "nl", text: "Leg aan een kind van tien uit hoe fotosynthese werkt." },
  { lang: "nl", text: "Wat zijn de mooiste plekken om in de zomer in Zeeland te bezoeken?" },
  { lang: "nl", text: "Vat dit artikel alsjeblieft samen in drie zinnen." },
  { lang: "pl", text: "Czy możesz mi pomóc napisać list motywacyjny na stanowisko pielęgniarki?" },
  { lang: "pl", text: "Pociąg znowu się spóźnił dziś rano, więc przegapiłem spotkanie." },
  { lang: "pl", text: "Wyjaśnij dziesięcioletniemu dziecku, jak działa fotosynteza." },
  { lang: "pl", text: "Jakie są najlepsze miejsca do odwiedzenia na Mazurach latem?" },
  { lang: "pl", text: "Proszę, streść ten artykuł w trzech zdaniach." },
  { lang: "en", text: "fix my code" },
  { lang: "fr", text: "bonjour, ça va ?" },
  { lang: "de", text: "wie spät ist es" },
  { lang: "es", text: "¿dónde está el baño?" },
];
